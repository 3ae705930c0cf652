"""The rejoin chaos scenario, shared by tests/integration/test_chaos.py and bench/chaos.py.

Traffic runs while worker processes are stopped (SIGTERM), killed (SIGKILL), added and removed,
with CPU load added by bounded busy-loop processes; then the pipeline settles and the check
reads the topics: every produced event is in exactly one trajectory (its call's) or on a
recorded topic (late-events, dead-letters), and every START's prompt reached its trajectory.
Bounded in rounds and in time; everything it starts is stopped by it, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiokafka.admin import AIOKafkaAdminClient

from streams.broker import free_port
from streams.codec import SchemaRegistry
from streams.devtools.traffic import simulate_call
from streams.errors import RecordError
from streams.io import kafka
from streams.models import AgentCall, CallPhase, Completion, DeadLetter, Trajectory
from streams.sdk import TrajstreamProducer, new_id

ACTIONS = ("sigterm", "sigkill", "scale-up", "scale-down")


class FakeChat:
    """Completions without HTTP: the chaos is in the workers, not in Trinity."""

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": new_id(), "model": body["model"], "choices": [{"message": {"content": "ok"}}]}


class RecordingProducer(TrajstreamProducer):
    """Remembers every event it published, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[AgentCall | Completion] = []

    async def publish(self, record: Any, *, wait: bool = True) -> None:
        await super().publish(record, wait=wait)
        if isinstance(record, AgentCall | Completion):
            self.sent.append(record)


def worker_env(trinity_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "TRAJSTREAM_TRINITY__URL": trinity_url,
        "TRAJSTREAM_SELECTION__STRATEGY": "sampling:1",  # every call gets a trajectory
        "TRAJSTREAM_KAFKA__PARTITIONS": 4,
        "TRAJSTREAM_ASSEMBLY__ABANDON_AFTER_S": 600,  # nothing is abandoned during the run
        "TRAJSTREAM_ASSEMBLY__TICK_S": 1,
        "TRAJSTREAM_COMMIT__INTERVAL_S": 5,
        "BROKER_SESSION_TIMEOUT": 10,  # a killed worker's partitions move on in seconds
        **extra,
    }


PROBE_LIMITS = {
    "TRAJSTREAM_OBSERVE__RECOVERY_STALL_S": "20",
    "TRAJSTREAM_OBSERVE__CONSUMPTION_STALL_S": "30",
    "TRAJSTREAM_OBSERVE__LAG_INTERVAL_S": "2",
}
"""The stall limits of the workers :class:`Liveness` starts: shorter than the defaults (300 s
and 120 s), so that a restart fits in a run."""


class Liveness:
    """A liveness probe, as a deployment has one (docs/how-to/monitoring.md): every
    ``every`` seconds it asks each running worker's ``/healthz``; a worker that answers 503
    (its tables' recovery has read nothing for ``observe.recovery_stall_s``, or a partition of
    agent-events has stopped moving for ``observe.consumption_stall_s``) is stopped (SIGTERM,
    SIGKILL if it hangs) and started again, as Kubernetes restarts a container that fails its
    probe. Faust can leave a worker's recovery waiting forever for changelog partitions it was
    just assigned (seen in CI: "No event received for active tp ... since recovery start"); the
    restart is the documented remedy, and the check after it still finds any loss.
    :attr:`restarts` says which workers were restarted, and why."""

    def __init__(self, every: float = 2.0, log: Callable[[str], None] = print) -> None:
        self.every = every
        self.log = log
        self.workers: list[tuple[Any, str]] = []  # (a WorkerProcess, its /healthz)
        self.restarts: list[str] = []

    def spawner(self, spawn: Callable[..., Any]) -> Callable[[], Any]:
        """``spawn`` (the ``workers`` fixture, or :meth:`Workers.spawn`), each worker with a
        /healthz of its own and :data:`PROBE_LIMITS`, probed."""

        def start() -> Any:
            port = free_port()
            worker = spawn(
                **PROBE_LIMITS,
                TRAJSTREAM_OBSERVE__HOST="127.0.0.1",
                TRAJSTREAM_OBSERVE__PORT=str(port),
            )
            self.workers.append((worker, f"http://127.0.0.1:{port}/healthz"))
            return worker

        return start

    @asynccontextmanager
    async def probing(self) -> AsyncIterator[Liveness]:
        """Probe (:meth:`run`) for the duration of the ``async with`` block."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop))
        try:
            yield self
        finally:
            stop.set()
            await task

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until ``stop`` is set."""
        async with httpx.AsyncClient(timeout=2) as client:
            while not stop.is_set():
                for worker, url in list(self.workers):
                    if not worker.alive:
                        continue
                    try:
                        answer = await client.get(url)
                    except httpx.HTTPError:  # starting, or stopping: not an answer
                        continue
                    if answer.status_code != 503 or not worker.alive:
                        continue
                    reason = answer.json().get("reason", "")
                    self.restarts.append(f"{worker.log.name}: {reason}")
                    self.log(f"liveness: {worker.log.name} answered 503 ({reason}): restarted")
                    await asyncio.to_thread(worker.stop)
                    worker.start()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.every)


def cpu_load(seconds: float, n: int = 1) -> list[subprocess.Popen[bytes]]:
    """``n`` busy loops that end by themselves after ``seconds``."""
    code = f"import time\nt = time.monotonic() + {seconds}\nwhile time.monotonic() < t: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


@dataclass
class Traffic:
    producer: RecordingProducer
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    calls: int = 0
    failed: int = 0

    async def run(self, pause: float, seed: int) -> None:
        rng = random.Random(seed)
        chat = FakeChat()
        while not self.stop.is_set():
            try:
                await simulate_call(
                    self.producer, chat, rng, agent="support-bot", fail=self.calls % 5 == 4  # type: ignore[arg-type]
                )
            except Exception:  # the broker is restarting: this call stays unfinished
                self.failed += 1
                await asyncio.sleep(1)
            else:
                self.calls += 1
            await asyncio.sleep(pause)


async def run_rounds(
    spawn: Callable[[], Any],
    *,
    rounds: int,
    seconds: float,
    round_s: float,
    traffic: Traffic,
    load: int,
    log: Callable[[str], None] = print,
) -> Counter[str]:
    """Up to ``rounds`` rounds (and at most ``seconds``) of the four actions, in turn."""
    pool = [spawn()]
    done: Counter[str] = Counter()
    busy = cpu_load(seconds + 5, load) if load else []
    deadline = time.monotonic() + seconds
    try:
        await asyncio.sleep(round_s)
        for i in range(rounds):
            if time.monotonic() > deadline:
                break
            action = ACTIONS[i % len(ACTIONS)]
            if action == "sigterm":
                await asyncio.to_thread(pool.pop(0).stop)
                pool.append(spawn())
            elif action == "sigkill":
                await asyncio.to_thread(pool.pop(0).kill)
                pool.append(spawn())
            elif action == "scale-up":
                pool.append(spawn())
            elif len(pool) > 1:
                await asyncio.to_thread(pool.pop(0).stop)
            done[action] += 1
            log(f"round {i + 1}: {action}, {len(pool)} worker(s), {traffic.calls} calls so far")
            await asyncio.sleep(round_s)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return done


@asynccontextmanager
async def _admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = kafka.admin(bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def read_records(bootstrap: str, topic: str, stall_s: float = 60.0) -> list[Any]:
    """Every record ``topic`` holds now, partition by partition: read up to the end offsets taken
    first (not until the topic has been quiet for a while, which a loaded broker's slow first
    fetch would end early, missing records that are there)."""
    async with _admin(bootstrap) as admin:
        described = await admin.describe_topics([topic])
    partitions = [p["partition"] for d in described if d["topic"] == topic for p in d["partitions"]]
    reader = kafka.consumer(bootstrap)
    await reader.start()
    try:
        return await kafka.read_whole(reader, topic, sorted(partitions), stall_s=stall_s)
    finally:
        await reader.stop()


async def read_all(bootstrap: str, topic: str) -> list[bytes]:
    """The values of every record ``topic`` holds now (tombstones left out)."""
    return [m.value for m in await read_records(bootstrap, topic) if m.value is not None]


@dataclass
class Verdict:
    events: int
    calls: int
    in_trajectories: int
    recorded: int
    problems: list[str]
    waited_s: float = 0.0
    """How long :func:`settle` waited for this verdict after the traffic ended."""

    def __str__(self) -> str:
        return (
            f"{self.events} events of {self.calls} calls: {self.in_trajectories} in trajectories, "
            f"{self.recorded} on late-events/dead-letters, {len(self.problems)} problem(s) "
            f"(checked {self.waited_s:.0f} s after the traffic)"
        )


async def check(bootstrap: str, prefix: str, sent: list[AgentCall | Completion]) -> Verdict:
    """Every produced event in exactly one trajectory or recorded; every START's prompt kept.

    Only calls published whole (their END confirmed by the broker) count: a call cut off by the
    end of the traffic or a failed send stays open until abandoned, as it should.
    """
    ended = {e.call_id for e in sent if isinstance(e, AgentCall) and e.phase is CallPhase.END}
    sent = [e for e in sent if e.call_id in ended]
    codec = SchemaRegistry.default()
    trajectories: dict[str, Trajectory] = {}
    for raw in await read_all(bootstrap, f"{prefix}.trajectories"):
        t = codec.decode(raw)
        assert isinstance(t, Trajectory)
        trajectories[t.trajectory_id] = t  # at-least-once: the same trajectory again is one
    recorded: set[str] = set()
    for topic in ("late-events", "dead-letters"):
        for raw in await read_all(bootstrap, f"{prefix}.{topic}"):
            letter = codec.decode(raw)
            if isinstance(letter, DeadLetter):
                try:
                    event = codec.decode(letter.payload)
                except RecordError:
                    continue
                if isinstance(event, AgentCall | Completion):
                    recorded.add(event.event_id)
    holders: dict[str, list[str]] = defaultdict(list)
    for t in trajectories.values():
        for s in t.steps:
            holders[s.event_id].append(t.trajectory_id)
    problems: list[str] = []
    in_traj = 0
    for e in sent:
        t = trajectories.get(e.call_id)
        if isinstance(e, Completion):
            where = holders.get(e.event_id, [])
            ok = where == [e.call_id]
            if len(where) > 1:
                problems.append(f"step {e.event_id} in {len(where)} trajectories")
        elif e.phase is CallPhase.START:
            ok = t is not None and t.input_messages == e.input_messages
            if t is not None and not ok:
                problems.append(f"call {e.call_id}: its trajectory lost the START's prompt")
        else:
            ok = t is not None and t.closed_reason == "ended" and t.status == e.status
        if ok:
            in_traj += 1
        elif e.event_id not in recorded:
            problems.append(
                f"{type(e).__name__} {e.event_id} of call {e.call_id} is in no trajectory and "
                "on no recorded topic"
            )
    calls = len({e.call_id for e in sent})
    return Verdict(len(sent), calls, in_traj, len(recorded), problems)


async def where_missing(bootstrap: str, group: str, prefix: str, problems: list[str]) -> str:
    """Where the events named in ``problems`` sit on ``<prefix>.agent-events`` against the
    group's committed offsets: below a committed offset, a worker passed them (a loss); at or
    above it, they were not handled yet (a stall). Printed when the check fails."""
    missing = {p.split()[1] for p in problems if " is in no trajectory" in p}
    codec = SchemaRegistry.default()
    topic = f"{prefix}.agent-events"
    found: dict[int, list[int]] = defaultdict(list)
    ends: dict[int, int] = {}
    for m in await read_records(bootstrap, topic):
        ends[m.partition] = m.offset + 1
        try:
            event = codec.decode(m.value) if m.value is not None else None
        except RecordError:
            continue
        if getattr(event, "event_id", None) in missing:
            found[m.partition].append(m.offset)
    async with _admin(bootstrap) as admin:
        committed = await admin.list_consumer_group_offsets(group)
    lines = []
    for tp, meta in sorted(committed.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
        if tp.topic != topic:
            continue
        at = sorted(found.get(tp.partition, []))
        span = f"{len(at)} missing at {at[0]}..{at[-1]}" if at else "none missing"
        end = ends.get(tp.partition)
        lines.append(f"{topic}[{tp.partition}]: committed {meta.offset}, end {end}, {span}")
    return "\n".join(lines) or f"no committed offsets of group {group} on {topic}"


async def settle(
    verdict: Callable[[], Awaitable[Verdict]],
    timeout: float,
    every: float = 5.0,
    log: Callable[[str], None] = print,
) -> Verdict:
    """Check until nothing is missing or ``timeout``: the last calls need a moment to close.
    Each check that still finds problems is logged (falling counts: the workers are catching up;
    a count that holds: something is stuck or lost)."""
    began = time.monotonic()
    while True:
        v = await verdict()
        v.waited_s = time.monotonic() - began
        if not v.problems or v.waited_s > timeout:
            return v
        log(f"settle: {len(v.problems)} problem(s) after {v.waited_s:.0f} s")
        await asyncio.sleep(every)
