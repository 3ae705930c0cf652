"""A broker lost mid-traffic on a three-broker cluster: the scenario shared by
tests/integration/test_cluster_chaos.py and bench/cluster_chaos.py.

Real parts: a :class:`~streams.devtools.broker.LocalCluster` of three KRaft nodes (a quorum of
three controllers), a ``trajstream gateway`` process and worker processes, the Trinity
stand-in. Agents' traffic goes through the gateway over HTTP (a chat step answered by Trinity,
a tool result in the next step, the call's end). In each round a node is killed with SIGKILL,
either the leader of agent-events partition 0 or the active controller of the quorum, traffic
goes on without it, and it is started again on its data; the next round waits until every
partition is fully replicated again.

The check, at the topics and at Trinity:

* every request the gateway answered is on ``<p>.agent-events`` (a Completion with the answer's
  response id), and so is every END the gateway accepted (202);
* every event on ``<p>.agent-events`` of a call that ended is in exactly one trajectory (its
  call's) or on a recorded topic (:func:`tests.integration.chaos.check`);
* no feedback doubled beyond Trinity's once-per-msg_id rule: every msg_id sent to ``/feedback``
  is one Trinity issued, repeated sends of a msg_id carry the same reward, and the commits
  count each acknowledged trajectory once.

Bounded in rounds and time; everything it starts is stopped by it, also on failure.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from streams.codec import SchemaRegistry
from streams.devtools.broker import LocalCluster, free_port
from streams.devtools.standin import StandIn
from streams.models import AgentCall, CallPhase, CommitRecord, Completion, FeedbackAck

from .chaos import Verdict, check, read_all

REPO_ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4


def cluster_env(bootstrap: str, prefix: str, tmp: Path, trinity_url: str) -> dict[str, str]:
    """The settings of the gateway and the workers on the cluster: replication factor 3, so
    min.insync.replicas 2 (the default for 3)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    env.update(
        TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
        TRAJSTREAM_KAFKA__PARTITIONS=str(PARTITIONS),
        TRAJSTREAM_KAFKA__REPLICATION_FACTOR="3",
        TRAJSTREAM_APP_ID=prefix,
        TRAJSTREAM_DATA_DIR=str(tmp / "data"),
        TRAJSTREAM_TRINITY__URL=trinity_url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",  # every call: a trajectory, a feedback
        TRAJSTREAM_ASSEMBLY__ABANDON_AFTER_S="600",
        TRAJSTREAM_ASSEMBLY__TICK_S="1",
        TRAJSTREAM_COMMIT__INTERVAL_S="5",
        TRAJSTREAM_OBSERVE__PORT="0",
        TRAJSTREAM_LOG_LEVEL="info",
        BROKER_SESSION_TIMEOUT="10",
        PYTHONUNBUFFERED="1",
    )
    return env


@dataclass
class GatewayProcess:
    """``trajstream gateway`` as a process on a free port."""

    env: dict[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streams.cli", "gateway", "--port", str(self.port)],
                env=self.env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        return self

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
                try:
                    if (await http.get(f"{self.url}/healthz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.3)
        raise AssertionError(f"the gateway did not answer within {timeout:g}s")

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (the gateway flushes what it holds), SIGKILL if it hangs."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@dataclass
class GatewayTraffic:
    """Agent calls through the gateway: a chat step, a step with a tool result, the end."""

    url: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    answered: list[tuple[str, str]] = field(default_factory=list)  # (call id, response id)
    ended: set[str] = field(default_factory=set)
    failed: int = 0

    async def run(self, pause: float) -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while not self.stop.is_set():
                cid = f"c{uuid.uuid4().hex[:12]}"
                try:
                    await self._call(http, cid)
                except (httpx.HTTPError, AssertionError):
                    self.failed += 1
                    await asyncio.sleep(0.5)
                await asyncio.sleep(pause)

    async def _call(self, http: httpx.AsyncClient, cid: str) -> None:
        base = f"{self.url}/calls/{cid}/v1/chat/completions"
        headers = {"X-Trajstream-Agent-Name": "support-bot"}
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"where is order {cid}?"}]
        first = await http.post(base, json={"model": "m", "messages": messages}, headers=headers)
        assert first.status_code == 200, first.text
        self.answered.append((cid, first.json()["id"]))
        reply = first.json()["choices"][0]["message"]
        messages.append({"role": "assistant", "content": reply.get("content") or "looking"})
        messages.append({"role": "user", "content": "thanks, and the invoice?"})
        second = await http.post(base, json={"model": "m", "messages": messages}, headers=headers)
        assert second.status_code == 200, second.text
        self.answered.append((cid, second.json()["id"]))
        end = await http.post(
            f"{self.url}/calls/{cid}/end", json={"status": "OK", "output": "done"}, headers=headers
        )
        assert end.status_code == 202, end.text
        self.ended.add(cid)


def wait_fully_replicated(cluster: LocalCluster, topic: str, timeout: float = 90) -> None:
    """Until every partition of ``topic`` has all three replicas in sync again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(len(cluster.isr_of(topic, p)) == cluster.count for p in range(PARTITIONS)):
                return
        except Exception:  # a node still starting answers with errors for a moment
            pass
        time.sleep(1)
    raise AssertionError(f"{topic} not fully replicated again within {timeout:g}s")


async def kill_rounds(
    cluster: LocalCluster,
    topic: str,
    traffic: GatewayTraffic,
    *,
    rounds: list[str],
    down_s: float,
    after_s: float,
    log: Callable[[str], None] = print,
    first: int = 1,
) -> list[tuple[str, int]]:
    """Each round: SIGKILL the ``leader`` of ``topic``[0] or the active ``controller``, traffic
    for ``down_s`` without it, start it again, wait until fully replicated, ``after_s`` more."""
    killed: list[tuple[str, int]] = []
    for i, target in enumerate(rounds, start=first - 1):
        if target == "leader":
            node = await asyncio.to_thread(cluster.leader_of, topic, 0)
        else:
            node = await asyncio.to_thread(cluster.active_controller)
        before = len(traffic.answered)
        await asyncio.to_thread(cluster.kill, node)
        log(f"round {i + 1}: killed node {node} (the {target}), {before} answers so far")
        await asyncio.sleep(down_s)
        await asyncio.to_thread(cluster.start_node, node)
        await asyncio.to_thread(wait_fully_replicated, cluster, topic)
        log(f"round {i + 1}: node {node} back, {len(traffic.answered) - before} answers meanwhile")
        killed.append((target, node))
        await asyncio.sleep(after_s)
    return killed


@dataclass
class ClusterVerdict:
    events: Verdict
    answered: int
    problems: list[str]

    def __str__(self) -> str:
        return f"{self.events}; {self.answered} answers; {len(self.problems)} problem(s) in all"


async def verify(
    bootstrap: str, prefix: str, traffic: GatewayTraffic, standin: StandIn
) -> ClusterVerdict:
    codec = SchemaRegistry.default()
    events: dict[str, AgentCall | Completion] = {}
    for raw in await read_all(bootstrap, f"{prefix}.agent-events"):
        record = codec.decode(raw)
        if isinstance(record, AgentCall | Completion):
            events.setdefault(record.event_id, record)  # at-least-once: a repeat is one event
    problems: list[str] = []
    on_topic = {e.response_id for e in events.values() if isinstance(e, Completion)}
    for cid, response_id in traffic.answered:
        if response_id not in on_topic:
            problems.append(f"answered request {response_id} of call {cid} is not on the topic")
    ends = {
        e.call_id
        for e in events.values()
        if isinstance(e, AgentCall) and e.phase is CallPhase.END
    }
    problems += [
        f"the accepted end of call {cid} is not on the topic" for cid in traffic.ended - ends
    ]
    verdict = await check(bootstrap, prefix, list(events.values()))
    problems += verdict.problems
    problems += feedback_problems(standin)
    problems += await commit_problems(bootstrap, prefix)
    return ClusterVerdict(verdict, len(traffic.answered), problems)


def feedback_problems(standin: StandIn) -> list[str]:
    """Only msg_ids Trinity issued, one reward per msg_id however often it was sent."""
    state = standin.state
    rewards: dict[str, set[float]] = defaultdict(set)
    problems = []
    for record in state.feedback:
        body = record.body if isinstance(record.body, dict) else {}
        for msg_id in body.get("msg_ids", []):
            rewards[msg_id].add(float(body.get("reward", "nan")))
            if msg_id not in state.experiences:
                problems.append(f"feedback for {msg_id}, which Trinity never issued")
    problems += [f"msg_id {m} rewarded {sorted(r)}" for m, r in rewards.items() if len(r) > 1]
    applied = [m for record in state.feedback for m in record.applied]
    if len(applied) != len(set(applied)):
        problems.append("a msg_id was applied twice at Trinity")
    return problems


async def commit_problems(bootstrap: str, prefix: str) -> list[str]:
    """The commits count each acknowledged trajectory once."""
    codec = SchemaRegistry.default()
    acked = set()
    for raw in await read_all(bootstrap, f"{prefix}.ledger"):
        record = codec.decode(raw)
        if isinstance(record, FeedbackAck):
            acked.add(record.rewarded.trajectory_id)
    commits: dict[int, CommitRecord] = {}
    for raw in await read_all(bootstrap, f"{prefix}.commits"):
        record = codec.decode(raw)
        if isinstance(record, CommitRecord):
            commits[record.commit_seq] = record
    counted = sum(c.feedback_count for c in commits.values())
    if counted > len(acked):
        return [f"the commits count {counted} feedbacks for {len(acked)} acknowledged trajectories"]
    return []


async def settle(
    verdict: Callable[[], Any], timeout: float, every: float = 5.0
) -> ClusterVerdict:
    deadline = time.monotonic() + timeout
    while True:
        v: ClusterVerdict = await verdict()
        if not v.problems or time.monotonic() > deadline:
            return v
        await asyncio.sleep(every)
