"""trajstream benchmark: the pipeline against bare Kafka, measured side by side in one run.

    ./dev bench                 # everything, including the 10-minute soak (about 20 minutes)
    ./dev bench --quick         # a few seconds per scenario, small sizes (a smoke run)
    ./dev bench --only ceiling,pipeline --calls 5000

It starts its own local Kafka broker (or uses KAFKA_BOOTSTRAP_SERVERS / --bootstrap) and its own
Trinity stand-in process, and reports, as a table and as JSON (bench/results/latest.json):

1. ceiling    bare aiokafka consume -> produce of the same records, events/s
   faust      (context) a Faust agent that consumes the same records and does nothing
2. pipeline   one worker process: select, assemble, reward, feedback over loopback HTTP,
              windows, commits; events/s (every call selected: the full path for every event)
3. latency    call end produced -> feedback acknowledged at the stand-in, p50/p99, at half of
              the pipeline's measured rate
4. memory     worker RSS per open trajectory (10,000 open calls), and RSS drift over the soak
5. scaling    two worker processes against one, same broker, same backlog
6. state      per-event cost with 1,000 versus 100,000 open trajectories

Events are realistic: five per call (start, two LLM steps, one tool step, end), 1-4 KB each.
Every figure is from this run on this machine; targets are ratios within the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streams.codec import SchemaRegistry  # noqa: E402
from streams.devtools.broker import LocalBroker, free_port  # noqa: E402
from streams.models import (  # noqa: E402
    AgentCall,
    CallPhase,
    CallStatus,
    ChatMessage,
    Completion,
    StepKind,
    utcnow,
)
from streams.topics import Topics, create_topics  # noqa: E402

console = Console()
CODEC = SchemaRegistry.default()
PARTITIONS = 4
EVENTS_PER_CALL = 5


# -- realistic events ------------------------------------------------------------------------


def _text(rng: random.Random, size: int) -> str:
    words = [
        "the",
        "order",
        "shipped",
        "refund",
        "policy",
        "customer",
        "tracking",
        "number",
        "warehouse",
        "delivery",
        "weekend",
        "invoice",
        "account",
        "please",
        "thanks",
    ]
    out: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(words)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


def call_events(
    rng: random.Random, *, complete: bool = True, call_id: str | None = None
) -> list[tuple[bytes, bytes]]:
    """One call's events as (key, value) pairs: start, LLM, tool, LLM, end; 1-4 KB each."""
    cid = call_id or uuid.uuid4().hex
    now = utcnow()
    agent = rng.choice(["support-bot", "research-agent", "code-helper"])
    model = "qwen2.5-7b-instruct"
    start = AgentCall(
        event_id=uuid.uuid4().hex,
        call_id=cid,
        phase=CallPhase.START,
        event_time=now,
        agent_name=agent,
        input_messages=[ChatMessage(role="user", content=_text(rng, rng.randint(900, 2000)))],
    )
    steps = [
        Completion(
            event_id=uuid.uuid4().hex,
            call_id=cid,
            seq=0,
            event_time=now,
            request_model=model,
            response_model=model,
            response_id=f"chatcmpl-{uuid.uuid4().hex}",
            input_tokens=400,
            output_tokens=120,
            output_messages=[
                ChatMessage(role="assistant", content=_text(rng, rng.randint(900, 3500)))
            ],
            tool_calls=["lookup_order"],
        ),
        Completion(
            event_id=uuid.uuid4().hex,
            call_id=cid,
            seq=1,
            event_time=now,
            kind=StepKind.TOOL,
            operation_name="execute_tool",
            tool_name="lookup_order",
            output_messages=[
                ChatMessage(
                    role="tool", content=_text(rng, rng.randint(900, 3000)), name="lookup_order"
                )
            ],
        ),
        Completion(
            event_id=uuid.uuid4().hex,
            call_id=cid,
            seq=2,
            event_time=now,
            request_model=model,
            response_model=model,
            response_id=f"chatcmpl-{uuid.uuid4().hex}",
            input_tokens=900,
            output_tokens=200,
            output_messages=[
                ChatMessage(role="assistant", content=_text(rng, rng.randint(900, 3500)))
            ],
        ),
    ]
    events: list[Any] = [start, *steps]
    if complete:
        events.append(
            AgentCall(
                event_id=uuid.uuid4().hex,
                call_id=cid,
                phase=CallPhase.END,
                event_time=now,
                agent_name=agent,
                status=CallStatus.OK,
                output=_text(rng, 1000),
                step_count=3,
            )
        )
    key = cid.encode()
    return [(key, CODEC.encode(e)) for e in events]


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=20,
        max_batch_size=512 * 1024,
        max_request_size=4 * 1024 * 1024,
    )
    await producer.start()
    try:
        futures = []
        for key, value in records:
            futures.append(await producer.send(topic, value, key=key))
            if len(futures) >= 5000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


# -- processes -------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Standin:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "standin", "--port", str(self.port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the stand-in did not start")

    def counts(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_standin/counts", timeout=30).json()  # type: ignore[no-any-return]

    def state(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/_standin/state", timeout=120).json()  # type: ignore[no-any-return]

    def reset(self) -> None:
        httpx.post(f"{self.url}/_standin/reset", timeout=30)

    def stop(self) -> None:
        _kill(self.proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextmanager
def worker(
    bootstrap: str, prefix: str, standin: Standin, tmp: Path, n: int = 1, **extra: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    env.update(
        TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
        TRAJSTREAM_KAFKA__PARTITIONS=str(PARTITIONS),
        TRAJSTREAM_APP_ID=prefix,
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_DATA_DIR=str(tmp / prefix),
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S="5",
        TRAJSTREAM_LOG_LEVEL="warn",
        TRAJSTREAM_OBSERVE__PORT="0",
        TRAJSTREAM_ASSEMBLY__ABANDON_AFTER_S="3600",
        **extra,
    )
    procs = []
    try:
        for i in range(n):
            log = (tmp / f"{prefix}-worker{i}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "streams.cli", "worker"],
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield procs
    finally:
        for p in procs:
            _kill(p)


def wait_fed_back(
    standin: Standin, calls: int, timeout: float, procs: list[subprocess.Popen[bytes]]
) -> tuple[float, float, int]:
    """Poll until ``calls`` feedbacks arrived; returns (first seen, last seen, count at first)."""
    first: float | None = None
    first_count = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = standin.counts()["feedback_ok"]
        now = time.monotonic()
        if ok and first is None:
            first, first_count = now, ok
        if ok >= calls:
            return first or now, now, first_count
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a worker exited; see its log")
        time.sleep(0.1)
    raise TimeoutError(
        f"only {standin.counts()['feedback_ok']} of {calls} feedbacks after {timeout:g}s"
    )


# -- scenarios -------------------------------------------------------------------------------


async def fresh_run(bootstrap: str, standin: Standin, tag: str) -> tuple[str, Topics]:
    """A new topic prefix (and app id) for one scenario, its topics, and a clean stand-in."""
    prefix = f"{tag}{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix, PARTITIONS)
    await create_topics(bootstrap, topics.all())
    standin.reset()
    return prefix, topics


async def ceiling(bootstrap: str, calls: int, rng: random.Random) -> dict[str, Any]:
    """Bare aiokafka: consume a backlog and produce every record to another topic, batched."""
    src, dst = f"bench-{uuid.uuid4().hex[:6]}-in", f"bench-{uuid.uuid4().hex[:6]}-out"
    await create_topics(bootstrap, {src: PARTITIONS, dst: PARTITIONS})
    records = [r for _ in range(calls) for r in call_events(rng)]
    await produce(bootstrap, src, records)
    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=bootstrap,
        group_id=f"g-{src}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=512 * 1024,
        max_request_size=4 * 1024 * 1024,
    )
    await consumer.start()
    await producer.start()
    seen = 0
    started: float | None = None
    try:
        while seen < len(records):
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            if started is None and batch:
                started = time.monotonic()
            futures = []
            for tp, msgs in batch.items():
                for m in msgs:
                    futures.append(
                        await producer.send(dst, m.value, key=m.key, partition=tp.partition)
                    )
                seen += len(msgs)
            await asyncio.gather(*futures)
            if batch:
                await consumer.commit()
        elapsed = time.monotonic() - (started or time.monotonic())
    finally:
        await producer.stop()
        await consumer.stop()
    return {"events": seen, "seconds": round(elapsed, 3), "events_per_s": round(seen / elapsed, 1)}


async def faust_bare(bootstrap: str, calls: int, rng: random.Random) -> dict[str, Any]:
    """Faust's own consume loop with an agent that does nothing: the floor under the pipeline."""
    src = f"bench-{uuid.uuid4().hex[:6]}-bare"
    await create_topics(bootstrap, {src: PARTITIONS})
    records = [r for _ in range(calls) for r in call_events(rng)]
    await produce(bootstrap, src, records)
    out = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            str(ROOT / "bench" / "faust_bare.py"),
            bootstrap,
            src,
            str(PARTITIONS),
            str(len(records)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    # Faust sends what a worker prints to its log (stderr)
    line = next((x for x in (out.stdout + out.stderr).splitlines() if "RESULT " in x), None)
    if line is None:
        raise RuntimeError(f"faust_bare failed: {out.stderr[-2000:]}")
    _, n, seconds, rate = line[line.index("RESULT ") :].split()
    return {"events": int(n), "seconds": float(seconds), "events_per_s": float(rate)}


async def pipeline(
    bootstrap: str, standin: Standin, tmp: Path, calls: int, rng: random.Random, workers: int = 1
) -> dict[str, Any]:
    prefix, topics = await fresh_run(bootstrap, standin, "bp")
    await produce(
        bootstrap, topics.agent_events, [r for _ in range(calls) for r in call_events(rng)]
    )
    with worker(bootstrap, prefix, standin, tmp, n=workers) as procs:
        first, last, first_count = await asyncio.to_thread(
            wait_fed_back, standin, calls, 1800, procs
        )
        rss = [rss_kib(p.pid) for p in procs]
    counted = (calls - first_count) * EVENTS_PER_CALL
    seconds = last - first
    return {
        "workers": workers,
        "calls": calls,
        "events": calls * EVENTS_PER_CALL,
        "seconds": round(seconds, 3),
        "events_per_s": round(counted / seconds, 1) if seconds > 0 else None,
        "rss_kib": rss,
    }


async def latency(
    bootstrap: str,
    standin: Standin,
    tmp: Path,
    rate_events: float,
    seconds: float,
    rng: random.Random,
) -> dict[str, Any]:
    """Produce calls at a steady rate; latency from the END's ack to the feedback's arrival."""
    prefix, topics = await fresh_run(bootstrap, standin, "bl")
    calls_per_s = max(0.5, rate_events / EVENTS_PER_CALL)
    ends: dict[str, float] = {}
    with worker(bootstrap, prefix, standin, tmp) as procs:
        # warm-up: the worker has joined its group when a first call comes back
        await produce(bootstrap, topics.agent_events, call_events(rng))
        await asyncio.to_thread(wait_fed_back, standin, 1, 120, procs)
        # the calls are made before the clock starts: the producer should cost the machine
        # (two cores shared with the worker, the broker and the stand-in) as little as it can
        planned = [call_events(rng) for _ in range(int(seconds * calls_per_s) + 1)]
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=0, max_request_size=4 * 1024 * 1024
        )
        await producer.start()
        try:
            t0 = time.monotonic()
            for n, events in enumerate(planned, start=1):
                for key, value in events[:-1]:
                    await producer.send(topics.agent_events, value, key=key)
                await producer.send_and_wait(topics.agent_events, events[-1][1], key=events[-1][0])
                first_id = CODEC.decode_as(events[1][1], Completion).response_id
                assert first_id is not None
                ends[first_id] = time.monotonic()
                await asyncio.sleep(max(0.0, t0 + n / calls_per_s - time.monotonic()))
        finally:
            await producer.stop()
        await asyncio.to_thread(wait_fed_back, standin, len(ends) + 1, 300, procs)
    state = standin.state()
    arrived = {
        f["body"]["msg_ids"][0]: f["at"] for f in state["feedback"] if f.get("status") == 200
    }
    lat = sorted((arrived[m] - t) * 1000 for m, t in ends.items() if m in arrived)
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [lat[0]] * 99
    return {
        "calls": len(ends),
        "events_per_s_offered": round(len(ends) * EVENTS_PER_CALL / seconds, 1),
        "p50_ms": round(q[49], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(lat[-1], 1),
    }


async def open_state(
    bootstrap: str,
    standin: Standin,
    tmp: Path,
    open_calls: int,
    calls: int,
    rng: random.Random,
    open_events: int = 4,
) -> dict[str, Any]:
    """Memory and per-event cost with ``open_calls`` trajectories open in the worker, each
    holding its first ``open_events`` events (start and steps, no end)."""
    prefix, topics = await fresh_run(bootstrap, standin, "bo")
    partial = [
        r for _ in range(open_calls) for r in call_events(rng, complete=False)[:open_events]
    ]
    payload = sum(len(v) for _, v in partial)
    with worker(bootstrap, prefix, standin, tmp) as procs:
        pid = procs[0].pid
        await produce(bootstrap, topics.agent_events, call_events(rng))
        await asyncio.to_thread(wait_fed_back, standin, 1, 120, procs)
        await asyncio.sleep(2)
        before = rss_kib(pid)
        await produce(bootstrap, topics.agent_events, partial)
        await _wait_changelog(bootstrap, f"{prefix}-pending-changelog", len(partial))
        await asyncio.sleep(2)
        after = rss_kib(pid)
        standin.reset()
        await produce(
            bootstrap, topics.agent_events, [r for _ in range(calls) for r in call_events(rng)]
        )
        first, last, first_count = await asyncio.to_thread(
            wait_fed_back, standin, calls, 1800, procs
        )
    per_open = (after - before) * 1024 / max(1, open_calls)
    seconds = last - first
    return {
        "open_trajectories": open_calls,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "payload_bytes_per_open": round(payload / open_calls),
        "rss_bytes_per_open": round(per_open),
        "rss_overhead_bytes_per_open": round(per_open - payload / open_calls),
        "events_per_s": round((calls - first_count) * EVENTS_PER_CALL / seconds, 1)
        if seconds > 0
        else None,
    }


async def _wait_changelog(bootstrap: str, topic: str, at_least: int, timeout: float = 900) -> None:
    """Until the worker has written ``at_least`` changelog records (it consumed that much)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic)
            if parts:
                from aiokafka import TopicPartition

                ends = await consumer.end_offsets([TopicPartition(topic, p) for p in parts])
                if sum(ends.values()) >= at_least:
                    return
            else:
                await consumer.topics()
            await asyncio.sleep(0.5)
        raise TimeoutError(f"{topic} did not reach {at_least} records")
    finally:
        await consumer.stop()


async def soak(
    bootstrap: str,
    standin: Standin,
    tmp: Path,
    rate_events: float,
    seconds: float,
    rng: random.Random,
) -> dict[str, Any]:
    """RSS of one worker over a long run at a steady rate: flat, not growing."""
    prefix, topics = await fresh_run(bootstrap, standin, "bs")
    calls_per_s = max(0.5, rate_events / EVENTS_PER_CALL)
    samples: list[tuple[float, int]] = []
    with worker(
        bootstrap, prefix, standin, tmp, TRAJSTREAM_ASSEMBLY__LATE_RETENTION_S="60"
    ) as procs:
        pid = procs[0].pid
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=4 * 1024 * 1024
        )
        await producer.start()
        try:
            t0 = time.monotonic()
            n = 0
            next_sample = t0
            while time.monotonic() - t0 < seconds:
                for key, value in call_events(rng):
                    await producer.send(topics.agent_events, value, key=key)
                n += 1
                if time.monotonic() >= next_sample:
                    samples.append((round(time.monotonic() - t0, 1), rss_kib(pid)))
                    next_sample += max(1.0, seconds / 60)
                await asyncio.sleep(max(0.0, t0 + n / calls_per_s - time.monotonic()))
        finally:
            await producer.stop()
    # the first fifth is warm-up (imports, buffers, the late-event retention filling up)
    steady = [s for s in samples if s[0] >= seconds / 5]
    first, last = steady[0][1], steady[-1][1]
    peak = max(s[1] for s in steady)
    return {
        "seconds": seconds,
        "calls": n,
        "rss_first_kib": first,
        "rss_last_kib": last,
        "rss_peak_kib": peak,
        "drift_pct": round(100 * (last - first) / first, 2),
        "samples": samples,
    }


# -- the run ---------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    only = (
        set(args.only.split(","))
        if args.only
        else {"ceiling", "faust", "pipeline", "latency", "memory", "scaling", "state", "soak"}
    )
    if args.quick:
        only.discard("soak")
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "partitions": PARTITIONS,
    }
    tmp = Path(tempfile.mkdtemp(prefix="trajstream-bench-"))
    broker: LocalBroker | None = None
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = LocalBroker(
            Path(os.environ.get("TRAJSTREAM_CACHE_DIR", ROOT / ".cache" / "trajstream")), heap="1g"
        )
        bootstrap = broker.start(120)
    standin = Standin()
    try:
        if "ceiling" in only:
            with console.status("ceiling: bare aiokafka consume -> produce"):
                results["ceiling"] = await ceiling(bootstrap, args.calls, rng)
            console.print("ceiling", results["ceiling"])
        if "faust" in only:
            with console.status("faust: a bare Faust agent consuming the same records"):
                results["faust_bare"] = await faust_bare(bootstrap, args.calls, rng)
            console.print("faust_bare", results["faust_bare"])
        if "pipeline" in only:
            with console.status("pipeline: one worker"):
                results["pipeline"] = await pipeline(bootstrap, standin, tmp, args.calls, rng)
            console.print("pipeline", results["pipeline"])
        if "latency" in only:
            rate = (results.get("pipeline", {}).get("events_per_s") or 500) / 2
            with console.status(f"latency at {rate:.0f} events/s"):
                results["latency"] = await latency(
                    bootstrap, standin, tmp, rate, args.latency_seconds, rng
                )
            console.print("latency", results["latency"])
        if "memory" in only:
            with console.status(f"memory: {args.open_calls} open trajectories"):
                results["memory"] = await open_state(
                    bootstrap, standin, tmp, args.open_calls, max(200, args.calls // 10), rng
                )
            console.print("memory", results["memory"])
        if "scaling" in only:
            with console.status("scaling: two workers"):
                results["scaling"] = await pipeline(
                    bootstrap, standin, tmp, args.calls, rng, workers=2
                )
            console.print("scaling", results["scaling"])
        if "state" in only:
            small, large = (100, 2000) if args.quick else (1000, 100_000)
            with console.status(f"state: {small} vs {large} open trajectories"):
                # open calls of one event (their start) keep the prefill short
                n = max(1000, args.calls // 4)
                a = await open_state(bootstrap, standin, tmp, small, n, rng, open_events=1)
                b = await open_state(bootstrap, standin, tmp, large, n, rng, open_events=1)
            results["state"] = {"small": a, "large": b}
            console.print("state", results["state"])
        if "soak" in only:
            rate = (results.get("pipeline", {}).get("events_per_s") or 500) / 2
            with console.status(f"soak: {args.soak_seconds:g}s at {rate:.0f} events/s"):
                results["soak"] = await soak(bootstrap, standin, tmp, rate, args.soak_seconds, rng)
            console.print("soak", {k: v for k, v in results["soak"].items() if k != "samples"})
    finally:
        standin.stop()
        if broker is not None:
            broker.stop()
    return results


def verdicts(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    c, p = r.get("ceiling", {}).get("events_per_s"), r.get("pipeline", {}).get("events_per_s")
    if c and p:
        rows.append(("pipeline / ceiling", f"{p:,.0f} / {c:,.0f} ev/s", f"{p / c:.3f}", ">= 0.5"))
    f = r.get("faust_bare", {}).get("events_per_s")
    if c and f:
        rows.append(
            ("bare Faust agent / ceiling", f"{f:,.0f} / {c:,.0f} ev/s", f"{f / c:.3f}", "(context)")
        )
    if f and p:
        rows.append(
            (
                "pipeline / bare Faust agent",
                f"{p:,.0f} / {f:,.0f} ev/s",
                f"{p / f:.3f}",
                "(context)",
            )
        )
    if "latency" in r:
        rows.append(
            (
                "p99 latency at half load",
                f"p50 {r['latency']['p50_ms']} ms",
                f"{r['latency']['p99_ms']} ms",
                "<= 250 ms",
            )
        )
    if "memory" in r:
        m = r["memory"]
        rows.append(
            (
                "RSS per open trajectory beyond payload",
                f"{m['rss_bytes_per_open']:,} B total",
                f"{m['rss_overhead_bytes_per_open'] / 1024:.2f} KiB",
                "<= 2 KiB",
            )
        )
    if "soak" in r:
        rows.append(
            (
                "RSS drift over the soak",
                f"{r['soak']['rss_first_kib']:,} -> {r['soak']['rss_last_kib']:,} KiB",
                f"{r['soak']['drift_pct']} %",
                "< 5 %",
            )
        )
    s, p1 = r.get("scaling", {}).get("events_per_s"), p
    if s and p1:
        rows.append(("two workers / one", f"{s:,.0f} / {p1:,.0f} ev/s", f"{s / p1:.2f}", ">= 1.5"))
    if "state" in r:
        a, b = r["state"]["small"]["events_per_s"], r["state"]["large"]["events_per_s"]
        rows.append(
            (
                f"per-event cost, {r['state']['large']['open_trajectories']:,} vs "
                f"{r['state']['small']['open_trajectories']:,} open",
                f"{b:,.0f} vs {a:,.0f} ev/s",
                f"{(a / b if b else float('nan')):.2f}x cost",
                "~1.0x (flat)",
            )
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, no soak: a smoke run")
    parser.add_argument(
        "--only", help="comma-separated: ceiling,faust,pipeline,latency,memory,scaling,state,soak"
    )
    parser.add_argument(
        "--calls", type=int, default=None, help="calls per throughput run (5 events each)"
    )
    parser.add_argument("--open-calls", type=int, default=None)
    parser.add_argument("--latency-seconds", type=float, default=None)
    parser.add_argument("--soak-seconds", type=float, default=600)
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = parser.parse_args()
    a.calls = a.calls or (200 if a.quick else 4000)
    a.open_calls = a.open_calls or (1000 if a.quick else 10_000)
    a.latency_seconds = a.latency_seconds or (5 if a.quick else 30)
    res = asyncio.run(main(a))
    table = Table(title=f"trajstream benchmark, {res['date']}, {res['machine']}")
    for col in ("measure", "figures", "result", "target"):
        table.add_column(col)
    for row in verdicts(res):
        table.add_row(*row)
    console.print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = res["date"].replace(":", "").replace("+0000", "Z")
    for name in (f"{stamp}.json", "latest.json"):
        tmpf = a.out / f".{name}.tmp"
        tmpf.write_text(json.dumps(res, indent=2) + "\n")
        tmpf.replace(a.out / name)
    console.print(f"results: {a.out / 'latest.json'}")
