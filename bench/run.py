"""trajstream benchmark: the pipeline against bare Kafka, measured side by side in one run.

    ./dev bench                 # everything, including the 30-minute soak (about 50 minutes)
    ./dev bench --quick         # small sizes, no soak: a smoke run (about 3 minutes)
    ./dev bench --only memory,changelog --open-calls 4000
    ./dev bench --only soak --soak-seconds 600

It starts its own local Kafka broker (or uses KAFKA_BOOTSTRAP_SERVERS / --bootstrap) and its own
Trinity stand-in process, and reports, as a table and as JSON (bench/results/latest.json), each
figure as a ratio within the run with its target and whether it is met. ``--only`` names:

ceiling    bare aiokafka consume -> produce of the same records, events/s; target: the
           pipeline >= 0.25 of it
faust      a Faust agent that consumes the same records and does nothing, events/s. Both
           floors drain a backlog so fast that one run is mostly start-up: a probe run sizes
           the backlog to last --floor-seconds (20), then the median of --repeats (3) runs is
           reported with its spread
pipeline   one worker process: select, assemble, reward, feedback over loopback HTTP,
           windows, commits; events/s (every call selected: the full path for every event);
           target: >= 0.7 of the bare Faust agent
latency    call END produced -> feedback acknowledged at the stand-in, p50/p99, at half of
           the pipeline's measured rate; target: p99 <= 100 ms
memory     worker RSS per open call beyond its payload, open calls of 1 and of 10 events that
           never end (RSS before and after, minus the records' bytes); target: <= 1 KiB each
changelog  bytes a worker writes to its changelog topics (<app_id>-*-changelog, read back
           record by record) and to all its topics, per byte of input, for calls of 5 and of
           100 steps; target: changelog <= 2x each; and records produced per call, all topics
           (target: <= 8 per 5-step call)
scaling    1, 2 and 4 worker processes on one backlog: worker CPU seconds (utime + stime of
           /proc/<pid>/stat, summed) per 1,000 events while draining it; target: within 10%
           of each other; and throughput of 2 workers against 1 (context: 2 shared cores)
state      events/s with 100,000 open calls against 1,000; target: within 10%
soak       one worker's RSS over --soak-seconds at half load, sampled ~120 times; after the
           first fifth (warm-up): first/last/peak, drift and slope; target: drift < 2 %

Events are realistic: calls of a start, LLM and tool steps and an end, 1-4 KB each (five events
per call unless a scenario says otherwise). Every figure is from this run on this machine.
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
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streams.codec import SchemaRegistry  # noqa: E402
from streams.devtools.broker import KAFKA_VERSION, LocalBroker, free_port  # noqa: E402
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
# memory: seconds between consuming a shape and reading RSS: more than the worker's heap trim
# interval (streams.runtime.live.worker.TRIM_EVERY_S), so that what the burst's buffers took and
# freed is not counted as held per open call
MEMORY_SETTLE_S = 12
EVENTS_PER_CALL = 5
CLK_TCK = os.sysconf("SC_CLK_TCK")
TRACE_DIR: Path | None = None
"""--trace-memory: workers run under tracemalloc (bench/traced_worker.py), dumps written here."""
TRACE_EVERY_S: float | None = None
"""--trace-every: the soak's dumps every this many seconds after the base (else minutes 6, 16)."""


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
    rng: random.Random, *, complete: bool = True, call_id: str | None = None, steps: int = 3
) -> list[tuple[bytes, bytes]]:
    """One call's events as (key, value) pairs: start, ``steps`` steps (LLM, tool, LLM, ...:
    an LLM step that calls a tool is followed by the tool's step), end; 1-4 KB each."""
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
    events: list[Any] = [start]
    for seq in range(steps):
        if seq % 2 == 1:
            events.append(
                Completion(
                    event_id=uuid.uuid4().hex,
                    call_id=cid,
                    seq=seq,
                    event_time=now,
                    kind=StepKind.TOOL,
                    operation_name="execute_tool",
                    tool_name="lookup_order",
                    output_messages=[
                        ChatMessage(
                            role="tool",
                            content=_text(rng, rng.randint(900, 3000)),
                            name="lookup_order",
                        )
                    ],
                )
            )
            continue
        events.append(
            Completion(
                event_id=uuid.uuid4().hex,
                call_id=cid,
                seq=seq,
                event_time=now,
                request_model=model,
                response_model=model,
                response_id=f"chatcmpl-{uuid.uuid4().hex}",
                input_tokens=400 + 500 * seq,
                output_tokens=120,
                output_messages=[
                    ChatMessage(role="assistant", content=_text(rng, rng.randint(900, 3500)))
                ],
                tool_calls=["lookup_order"] if seq + 1 < steps else [],
            )
        )
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
                step_count=steps,
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the command's closing parenthesis: state is field 3, utime 14, stime 15 (1-based)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine(kafka_version: str) -> dict[str, Any]:
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    return {
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kafka": kafka_version,
        "kernel": platform.release(),
    }


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


def _kill(proc: subprocess.Popen[bytes], hard: bool = False) -> None:
    if proc.poll() is None and hard:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
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
    command = [sys.executable, "-m", "streams.cli", "worker"]
    if TRACE_DIR is not None:
        traced = ROOT / "bench" / "traced_worker.py"
        command = [sys.executable, str(traced), str(TRACE_DIR / prefix), "worker"]
    try:
        for i in range(n):
            log = (tmp / f"{prefix}-worker{i}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    command,
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        yield procs
    finally:
        # what was measured is in: a graceful stop (seconds per worker) would only cost time
        for p in procs:
            _kill(p, hard=True)


async def trace(prefix: str, name: str, timeout: float = 600) -> str | None:
    """With --trace-memory: ask the (one) traced worker of ``prefix`` for a tracemalloc dump
    against its first one (``base``); returns the dump's path. Without it: nothing."""
    if TRACE_DIR is None:
        return None
    folder = TRACE_DIR / prefix
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.want").touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # another process answers, by a file
        if not (folder / f"{name}.want").exists():
            break
        await asyncio.sleep(0.2)
    return str(folder / f"{name}.txt")


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


def spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run of several, with the spread of their rates beside it."""
    rates = sorted(r["events_per_s"] for r in runs)
    median = statistics.median(rates)
    mid = min(runs, key=lambda r: abs(r["events_per_s"] - median))
    return {
        **mid,
        "events_per_s": round(median, 1),
        "repeats": len(runs),
        "events_per_s_min": rates[0],
        "events_per_s_max": rates[-1],
        "spread_pct": round(100 * (rates[-1] - rates[0]) / median, 1) if median else None,
        "runs": [{k: r[k] for k in ("events", "seconds", "events_per_s")} for r in runs],
    }


async def steady(
    measure: Any, calls: int, rng: random.Random, min_seconds: float, repeats: int
) -> dict[str, Any]:
    """A floor that holds still: a bare consumer drains a backlog of ``calls`` calls in a second
    or two, so its rate is mostly start-up noise. One probe run gives the rate; the backlog is
    then sized so that a run lasts at least ``min_seconds`` (at most 400,000 events), and the
    median of ``repeats`` runs is reported with its spread."""
    probe = await measure(calls, rng)
    if min_seconds <= 0 or repeats <= 1:
        return spread([probe])
    rate = probe["events_per_s"] or 1.0
    # at most 400,000 events (about 1 GB built in memory, and as much on the broker's disk)
    sized = max(calls, min(80_000, int(rate * min_seconds * 1.25 / EVENTS_PER_CALL) + 1))
    runs = [await measure(sized, rng) for _ in range(repeats)]
    return {**spread(runs), "probe": {k: probe[k] for k in ("events", "seconds", "events_per_s")}}


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
        await wait_consumed(bootstrap, prefix, topics.agent_events)
        await asyncio.sleep(3)  # the last commit interval's ledger and ticks
    counted = (calls - first_count) * EVENTS_PER_CALL
    seconds = last - first
    written = await records_written(bootstrap, prefix, topics.agent_events)
    return {
        "records_written": written,
        "records_per_call": round(sum(written.values()) / calls, 2),
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


async def wait_consumed(bootstrap: str, group: str, topic: str, timeout: float = 900) -> None:
    """Until the consumer group ``group`` (a worker's app id) has committed every partition of
    ``topic`` up to its end: the worker has processed all there is, whatever it stores."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await admin.start()
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            committed = await admin.list_consumer_group_offsets(group, partitions=tps)
            # a partition with nothing in it has no committed offset (-1, or none at all)
            done = [
                ends[tp] == 0 or (tp in committed and committed[tp].offset >= ends[tp])
                for tp in tps
            ]
            if all(done):
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"group {group} did not consume {topic} to its end")
    finally:
        await consumer.stop()
        await admin.close()


async def topic_bytes(bootstrap: str, topics: list[str]) -> dict[str, dict[str, int]]:
    """Records and bytes (key + value lengths of every record, as stored) of each topic, read
    from its beginning to its end offsets."""
    out: dict[str, dict[str, int]] = {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    partitions = {d["topic"]: sorted(x["partition"] for x in d["partitions"]) for d in described}
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in partitions.get(topic, [])]
            ends = await consumer.end_offsets(tps) if tps else {}
            todo = [tp for tp in tps if ends[tp] > 0]
            records = size = 0
            if todo:
                consumer.assign(todo)
                await consumer.seek_to_beginning(*todo)
                while todo:
                    batch = await consumer.getmany(*todo, timeout_ms=1000, max_records=5000)
                    for msgs in batch.values():
                        for m in msgs:
                            records += 1
                            size += len(m.key or b"") + len(m.value or b"")
                    todo = [tp for tp in todo if await consumer.position(tp) < ends[tp]]
            out[topic] = {"records": records, "bytes": size}
    finally:
        await consumer.stop()
    return out


async def records_written(bootstrap: str, prefix: str, skip: str) -> dict[str, int]:
    """Records in each topic of a deployment but ``skip`` (its input), from the end offsets:
    cheap enough for a throughput run's whole backlog."""
    topics = [t for t in await app_topics(bootstrap, prefix) if t != skip]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        out: dict[str, int] = {}
        for d in described:
            topic = d["topic"]
            tps = [TopicPartition(topic, x["partition"]) for x in d["partitions"]]
            if tps:
                begin, end = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
                n = sum(end[tp] - begin[tp] for tp in tps)
                if n:
                    out[topic.removeprefix(prefix)] = n
        return out
    finally:
        await consumer.stop()


async def app_topics(bootstrap: str, prefix: str) -> list[str]:
    """The topics of one deployment: ``<prefix>.*`` (the pipeline's) and ``<prefix>-*`` (its
    app's own: ``<app_id>-<table>-changelog``, faust's assignor topic, repartitions)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        names = await consumer.topics()
    finally:
        await consumer.stop()
    return sorted(t for t in names if t.startswith((f"{prefix}.", f"{prefix}-")))


async def open_state(
    bootstrap: str,
    standin: Standin,
    tmp: Path,
    open_calls: int,
    calls: int,
    rng: random.Random,
    open_events: int = 4,
) -> dict[str, Any]:
    """Per-event cost with ``open_calls`` trajectories open in the worker, each holding its
    first ``open_events`` events (start and steps, no end)."""
    prefix, topics = await fresh_run(bootstrap, standin, "bo")
    partial = [
        r
        for _ in range(open_calls)
        for r in call_events(rng, complete=False, steps=max(0, open_events - 1))[:open_events]
    ]
    payload = sum(len(v) for _, v in partial)
    with worker(bootstrap, prefix, standin, tmp) as procs:
        pid = procs[0].pid
        await produce(bootstrap, topics.agent_events, call_events(rng))
        await asyncio.to_thread(wait_fed_back, standin, 1, 120, procs)
        await asyncio.sleep(2)
        before = rss_kib(pid)
        await produce(bootstrap, topics.agent_events, partial)
        await wait_consumed(bootstrap, prefix, topics.agent_events)
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


async def memory(
    bootstrap: str,
    standin: Standin,
    tmp: Path,
    shapes: list[tuple[int, int]],
    rng: random.Random,
    settle: float = MEMORY_SETTLE_S,
) -> dict[str, Any]:
    """RSS per open call beyond its payload, for each (events per call, open calls) in
    ``shapes``: open calls that never end (no END, abandonment an hour away) are produced one
    shape after the other into one worker; the worker's RSS is read once it has consumed each
    shape (its group committed the input's end), and the payload (the records' bytes) is
    subtracted from the growth. RSS is read ``settle`` seconds after each shape was consumed."""
    prefix, topics = await fresh_run(bootstrap, standin, "bm")
    out: dict[str, Any] = {}
    with worker(bootstrap, prefix, standin, tmp) as procs:
        pid = procs[0].pid
        # warm-up: one full call, so that imports, connections and buffers are in place
        await produce(bootstrap, topics.agent_events, call_events(rng))
        await asyncio.to_thread(wait_fed_back, standin, 1, 120, procs)
        await wait_consumed(bootstrap, prefix, topics.agent_events)
        await asyncio.sleep(settle)
        before = rss_kib(pid)
        traces = {"base": await trace(prefix, "base")}
        for events, n in shapes:
            partial = [
                r
                for _ in range(n)
                for r in call_events(rng, complete=False, steps=events - 1)[:events]
            ]
            # in two halves, RSS read after each: the second half's growth is what each more
            # open call costs (the average over the shape also holds bounded caches filling up)
            halves = (partial[: n // 2 * events], partial[n // 2 * events :])
            payloads = [sum(len(k) + len(v) for k, v in part) for part in halves]
            payload = sum(payloads)
            t0 = time.monotonic()
            await produce(bootstrap, topics.agent_events, halves[0])
            await wait_consumed(bootstrap, prefix, topics.agent_events)
            await asyncio.sleep(settle)
            middle = rss_kib(pid)
            await produce(bootstrap, topics.agent_events, halves[1])
            await wait_consumed(bootstrap, prefix, topics.agent_events)
            seconds = time.monotonic() - t0 - settle
            await asyncio.sleep(settle)
            after = rss_kib(pid)
            per_open = (after - before) * 1024 / n
            second = n - n // 2  # calls of the second half
            marginal = (after - middle) * 1024 / second
            out[f"events_{events}"] = {
                "events_per_call": events,
                "open_calls": n,
                "rss_before_kib": before,
                "rss_middle_kib": middle,
                "rss_after_kib": after,
                "payload_bytes_per_open": round(payload / n),
                "rss_bytes_per_open": round(per_open),
                "rss_overhead_bytes_per_open": round(per_open - payload / n),
                "rss_marginal_overhead_bytes_per_open": round(marginal - payloads[1] / second),
                "seconds_to_consume": round(seconds, 1),
            }
            traces[f"events_{events}"] = await trace(prefix, f"events_{events}")
            before = after
    if TRACE_DIR is not None:
        out["tracemalloc"] = traces
    return out


async def changelog(
    bootstrap: str,
    standin: Standin,
    tmp: Path,
    steps: int,
    calls: int,
    rng: random.Random,
    settle: float = 6,
) -> dict[str, Any]:
    """Bytes a worker writes per byte of input for ``calls`` calls of ``steps`` steps: the
    calls are produced (complete, every one selected), one worker processes them (every call
    fed back, the input consumed to its end, a commit interval passed), it is stopped, and the
    records of its topics are read back: its changelog topics (``<app_id>-*-changelog``) and
    every topic it produced to (all of the deployment's but the input)."""
    prefix, topics = await fresh_run(bootstrap, standin, "bc")
    records = [r for _ in range(calls) for r in call_events(rng, steps=steps)]
    input_bytes = sum(len(k) + len(v) for k, v in records)
    with worker(bootstrap, prefix, standin, tmp) as procs:
        t0 = time.monotonic()
        await produce(bootstrap, topics.agent_events, records)
        await asyncio.to_thread(wait_fed_back, standin, calls, 1800, procs)
        await wait_consumed(bootstrap, prefix, topics.agent_events)
        seconds = time.monotonic() - t0
        await asyncio.sleep(settle)  # a commit interval: what the ledger writes for them
    produced = [t for t in await app_topics(bootstrap, prefix) if t != topics.agent_events]
    sizes = await topic_bytes(bootstrap, produced)
    changelogs = {t: v for t, v in sizes.items() if t.endswith("-changelog")}
    cl_bytes = sum(v["bytes"] for v in changelogs.values())
    all_bytes = sum(v["bytes"] for v in sizes.values())
    return {
        "steps": steps,
        "calls": calls,
        "events": len(records),
        "input_bytes": input_bytes,
        "changelog_bytes": cl_bytes,
        "changelog_records": sum(v["records"] for v in changelogs.values()),
        "produced_bytes": all_bytes,
        "produced_records": sum(v["records"] for v in sizes.values()),
        "produced_records_per_call": round(sum(v["records"] for v in sizes.values()) / calls, 2),
        "changelog_per_input_byte": round(cl_bytes / input_bytes, 3),
        "produced_per_input_byte": round(all_bytes / input_bytes, 3),
        "seconds_to_process": round(seconds, 1),
        "topics": {t.removeprefix(prefix): v for t, v in sizes.items() if v["records"]},
    }


async def scale_cost(
    bootstrap: str, standin: Standin, tmp: Path, calls: int, rng: random.Random, workers: int
) -> dict[str, Any]:
    """``workers`` worker processes on one backlog of ``calls`` calls: worker CPU seconds
    (utime + stime from /proc/<pid>/stat, summed over the workers) per 1,000 events while they
    drain it, and events/s. The workers start on an empty input and are warmed up first (a
    few calls per partition, all fed back) so that imports and group joins are not counted."""
    prefix, topics = await fresh_run(bootstrap, standin, "bw")
    backlog = [r for _ in range(calls) for r in call_events(rng)]
    warm = 6 * PARTITIONS  # by key: every partition gets some (all but surely)
    with worker(bootstrap, prefix, standin, tmp, n=workers) as procs:
        await produce(
            bootstrap, topics.agent_events, [r for _ in range(warm) for r in call_events(rng)]
        )
        await asyncio.to_thread(wait_fed_back, standin, warm, 300, procs)
        await wait_consumed(bootstrap, prefix, topics.agent_events)
        await asyncio.sleep(3)
        cpu0 = [cpu_seconds(p.pid) for p in procs]
        t0 = time.monotonic()
        await produce(bootstrap, topics.agent_events, backlog)
        produced_s = time.monotonic() - t0
        _, last, _ = await asyncio.to_thread(wait_fed_back, standin, warm + calls, 1800, procs)
        cpu1 = [cpu_seconds(p.pid) for p in procs]
        rss = [rss_kib(p.pid) for p in procs]
    events = calls * EVENTS_PER_CALL
    seconds = last - t0
    cpu = [round(b - a, 2) for a, b in zip(cpu0, cpu1, strict=True)]
    return {
        "workers": workers,
        "calls": calls,
        "events": events,
        "seconds_to_drain": round(seconds, 2),
        "seconds_to_produce": round(produced_s, 2),
        "events_per_s": round(events / seconds, 1) if seconds > 0 else None,
        "cpu_s_per_worker": cpu,
        "cpu_s_per_1000_events": round(1000 * sum(cpu) / events, 3),
        "rss_kib": rss,
    }


def _slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS (KiB) over time (s), in KiB per hour."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [s[0] for s in samples], [s[1] for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return 0.0
    return 3600 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


async def soak(
    bootstrap: str,
    standin: Standin,
    tmp: Path,
    rate_events: float,
    seconds: float,
    rng: random.Random,
) -> dict[str, Any]:
    """RSS of one worker over a long run at a steady rate: flat, not growing. RSS is sampled
    about 120 times; the first fifth of the run is warm-up (imports, buffers, the late-event
    retention of 60 s filling up) and is left out of first/last/peak/drift/slope."""
    prefix, topics = await fresh_run(bootstrap, standin, "bs")
    calls_per_s = max(0.5, rate_events / EVENTS_PER_CALL)
    samples: list[tuple[float, int]] = []
    # traced, the worker runs untraced until the base dump: traced from its start, it falls
    # behind the load (bench/traced_worker.py)
    traced = {"TRACE_FROM_BASE": "1"} if TRACE_DIR is not None else {}
    fed: list[tuple[float, int]] = []  # calls fed back over time: whether the worker keeps up
    with worker(
        bootstrap, prefix, standin, tmp, TRAJSTREAM_ASSEMBLY__LATE_RETENTION_S="60", **traced
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
            # with --trace-memory: a base dump after warm-up, then at minutes 6 and 16 (or every
            # --trace-every seconds after the base) and the end
            base = seconds / 5
            if TRACE_EVERY_S:
                marks = [base + k * TRACE_EVERY_S for k in range(int(seconds / TRACE_EVERY_S) + 1)]
            else:
                marks = sorted({base, 360.0, 960.0})
            dumps = [m for m in marks if m < seconds]
            traces: dict[str, str | None] = {}
            while time.monotonic() - t0 < seconds:
                if TRACE_DIR is not None and dumps and time.monotonic() - t0 >= dumps[0]:
                    at = dumps.pop(0)
                    traces["base" if not traces else f"at_{at:g}s"] = await trace(
                        prefix, "base" if not traces else f"at_{at:g}s"
                    )
                for key, value in call_events(rng):
                    await producer.send(topics.agent_events, value, key=key)
                n += 1
                if time.monotonic() >= next_sample:
                    samples.append((round(time.monotonic() - t0, 1), rss_kib(pid)))
                    fed.append((samples[-1][0], standin.counts()["feedback_ok"]))
                    next_sample += max(1.0, seconds / 120)
                await asyncio.sleep(max(0.0, t0 + n / calls_per_s - time.monotonic()))
            samples.append((round(time.monotonic() - t0, 1), rss_kib(pid)))
            if traces:
                traces["end"] = await trace(prefix, "end")
        finally:
            await producer.stop()
        fed_back = standin.counts()["feedback_ok"]
    steady = [s for s in samples if s[0] >= seconds / 5] or samples[-1:]
    first, last = steady[0][1], steady[-1][1]
    peak = max(s[1] for s in steady)
    slope = _slope(steady)
    return {
        "seconds": seconds,
        "warmup_seconds": round(seconds / 5, 1),
        "events_per_s_offered": round(rate_events, 1),
        "calls": n,
        "calls_fed_back": fed_back,
        "rss_first_kib": first,
        "rss_last_kib": last,
        "rss_peak_kib": peak,
        "drift_pct": round(100 * (last - first) / first, 2),
        "slope_kib_per_hour": round(slope, 1),
        "slope_pct_per_hour": round(100 * slope / first, 2),
        "samples": samples,
        "fed_back_samples": fed,
        **({"tracemalloc": traces} if traces else {}),
    }


# -- the run ---------------------------------------------------------------------------------

SCENARIOS = (
    "ceiling",
    "faust",
    "pipeline",
    "latency",
    "memory",
    "changelog",
    "scaling",
    "state",
    "soak",
)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    unknown = only - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"--only: unknown scenario(s) {sorted(unknown)}; known: {SCENARIOS}")
    if args.quick and not args.only:
        only.discard("soak")  # named in --only, it runs (for --soak-seconds)
    tmp = Path(tempfile.mkdtemp(prefix="trajstream-bench-"))
    broker: LocalBroker | None = None
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    kafka = f"{KAFKA_VERSION} (the project's launcher)"
    if bootstrap:
        kafka = f"external broker (version not read; the launcher's is {KAFKA_VERSION})"
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(kafka),
        "quick": bool(args.quick),
        "partitions": PARTITIONS,
        "scenarios": [s for s in SCENARIOS if s in only],
        "durations_s": {},
    }
    if not bootstrap:
        broker = LocalBroker(
            Path(os.environ.get("TRAJSTREAM_CACHE_DIR", ROOT / ".cache" / "trajstream")), heap="1g"
        )
        bootstrap = broker.start(120)
    standin = Standin()
    durations: dict[str, float] = results["durations_s"]

    @contextmanager
    def timed(name: str, what: str) -> Iterator[None]:
        t0 = time.monotonic()
        with console.status(f"{name}: {what}"):
            yield
        durations[name] = round(time.monotonic() - t0, 1)

    CURVES = ("samples", "runs", "fed_back_samples")  # in the JSON, not on the console

    def show(name: str, key: str | None = None) -> None:
        value = results[key or name]
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in CURVES}
        console.print(f"{name} ({durations[name]:g}s)", value)

    try:
        floor = {"min_seconds": args.floor_seconds, "repeats": args.repeats}
        if "ceiling" in only:
            with timed("ceiling", "bare aiokafka consume -> produce"):
                results["ceiling"] = await steady(
                    lambda n, g: ceiling(bootstrap, n, g), args.calls, rng, **floor
                )
            show("ceiling")
        if "faust" in only:
            with timed("faust", "a bare Faust agent consuming the same records"):
                results["faust_bare"] = await steady(
                    lambda n, g: faust_bare(bootstrap, n, g), args.calls, rng, **floor
                )
            show("faust", "faust_bare")
        if "pipeline" in only:
            with timed("pipeline", "one worker"):
                results["pipeline"] = await pipeline(bootstrap, standin, tmp, args.calls, rng)
            show("pipeline")
        half = (results.get("pipeline", {}).get("events_per_s") or 500) / 2
        soak_rate = args.soak_rate or half
        if "latency" in only:
            with timed("latency", f"at {half:.0f} events/s"):
                results["latency"] = await latency(
                    bootstrap, standin, tmp, half, args.latency_seconds, rng
                )
            show("latency")
        if "memory" in only:
            shapes = [(1, args.open_calls), (10, max(50, args.open_calls // 4))]
            with timed("memory", f"open calls {shapes} (events per call, calls)"):
                settle = 2 if args.quick else MEMORY_SETTLE_S
                results["memory"] = await memory(bootstrap, standin, tmp, shapes, rng, settle)
            show("memory")
        if "changelog" in only:
            shapes = [(5, args.changelog_calls), (100, max(2, args.changelog_calls // 50))]
            with timed("changelog", f"calls {shapes} (steps, calls)"):
                results["changelog"] = {
                    f"steps_{steps}": await changelog(
                        bootstrap, standin, tmp, steps, n, rng, settle=1 if args.quick else 6
                    )
                    for steps, n in shapes
                }
            show("changelog")
        if "scaling" in only:
            counts = args.scale_workers
            with timed("scaling", f"{'/'.join(map(str, counts))} workers on one backlog"):
                results["scaling"] = {
                    f"workers_{n}": await scale_cost(bootstrap, standin, tmp, args.calls, rng, n)
                    for n in counts
                }
            show("scaling")
        if "state" in only:
            small, large = (100, 2000) if args.quick else (1000, 100_000)
            with timed("state", f"{small} vs {large} open trajectories"):
                # open calls of one event (their start) keep the prefill short
                n = max(1000, args.calls // 4)
                a = await open_state(bootstrap, standin, tmp, small, n, rng, open_events=1)
                b = await open_state(bootstrap, standin, tmp, large, n, rng, open_events=1)
            results["state"] = {"small": a, "large": b}
            show("state")
        if "soak" in only:
            with timed("soak", f"{args.soak_seconds:g}s at {soak_rate:.0f} events/s"):
                results["soak"] = await soak(
                    bootstrap, standin, tmp, soak_rate, args.soak_seconds, rng
                )
            show("soak")
    finally:
        standin.stop()
        if broker is not None:
            broker.stop()
    results["verdicts"] = [
        dict(zip(("measure", "figures", "result", "target", "met"), row, strict=True))
        for row in verdicts(results)
    ]
    return results


Row = tuple[str, str, str, str, str]


def _met(ok: bool | None) -> str:
    return "context" if ok is None else ("met" if ok else "NOT met")


def verdicts(r: dict[str, Any]) -> list[Row]:
    """One row per figure: measure, the figures it is made of, the result (a ratio within
    this run), the target, and whether it is met."""
    rows: list[Row] = []
    c, p = r.get("ceiling", {}).get("events_per_s"), r.get("pipeline", {}).get("events_per_s")
    f = r.get("faust_bare", {}).get("events_per_s")

    def band(x: dict[str, Any]) -> str:
        if x.get("repeats", 1) <= 1:
            return "one run"
        return (
            f"median of {x['repeats']}, {x['events_per_s_min']:,.0f}-{x['events_per_s_max']:,.0f}"
            f" (spread {x['spread_pct']} %), {x['seconds']:g} s a run"
        )

    for key, name in (("faust_bare", "bare Faust agent"), ("ceiling", "bare aiokafka ceiling")):
        if key in r:
            rows.append(
                (
                    f"{name}, events/s",
                    band(r[key]),
                    f"{r[key]['events_per_s']:,.0f} ev/s",
                    "",
                    _met(None),
                )
            )
    if f and p:
        rows.append(
            (
                "pipeline / bare Faust agent",
                f"{p:,.0f} / {f:,.0f} ev/s",
                f"{p / f:.3f}",
                ">= 0.7",
                _met(p / f >= 0.7),
            )
        )
    if c and p:
        rows.append(
            (
                "pipeline / aiokafka ceiling",
                f"{p:,.0f} / {c:,.0f} ev/s",
                f"{p / c:.3f}",
                ">= 0.25",
                _met(p / c >= 0.25),
            )
        )
    if "records_per_call" in r.get("pipeline", {}):
        pl = r["pipeline"]
        top = sorted(pl["records_written"].items(), key=lambda kv: -kv[1])[:4]
        rows.append(
            (
                f"records produced per {EVENTS_PER_CALL}-event call, all topics",
                ", ".join(f"{t} {n / pl['calls']:.1f}" for t, n in top),
                f"{pl['records_per_call']:.1f}",
                "<= 8",
                _met(pl["records_per_call"] <= 8),
            )
        )
    if c and f:
        rows.append(
            (
                "bare Faust agent / ceiling",
                f"{f:,.0f} / {c:,.0f} ev/s",
                f"{f / c:.3f}",
                "",
                _met(None),
            )
        )
    if "latency" in r:
        lt = r["latency"]
        rows.append(
            (
                "END -> feedback acked, p99 at half load",
                f"p50 {lt['p50_ms']} ms at {lt['events_per_s_offered']:,.0f} ev/s",
                f"{lt['p99_ms']} ms",
                "<= 100 ms",
                _met(lt["p99_ms"] <= 100),
            )
        )
    for name, m in r.get("memory", {}).items():
        if not name.startswith("events_"):
            continue
        over = m["rss_overhead_bytes_per_open"]
        rows.append(
            (
                f"RSS per open call of {m['events_per_call']} event(s) beyond payload",
                f"{m['rss_bytes_per_open']:,} B - {m['payload_bytes_per_open']:,} B payload"
                f" ({m['open_calls']:,} calls)",
                f"{over / 1024:.2f} KiB",
                "<= 1 KiB",
                _met(over <= 1024),
            )
        )
        if "rss_marginal_overhead_bytes_per_open" in m:
            more = m["rss_marginal_overhead_bytes_per_open"]
            rows.append(
                (
                    "  of which each more open call (the shape's second half)",
                    f"{m['rss_after_kib'] - m['rss_middle_kib']:,} KiB for "
                    f"{m['open_calls'] - m['open_calls'] // 2:,} calls, beyond payload",
                    f"{more / 1024:.2f} KiB",
                    "(context)",
                    _met(None),
                )
            )
    for ch in r.get("changelog", {}).values():
        rows.append(
            (
                f"changelog bytes per input byte, {ch['steps']}-step calls",
                f"{ch['changelog_bytes']:,} / {ch['input_bytes']:,} B ({ch['calls']} calls)",
                f"{ch['changelog_per_input_byte']:.2f}x",
                "<= 2x",
                _met(ch["changelog_per_input_byte"] <= 2),
            )
        )
        rows.append(
            (
                f"all bytes produced per input byte, {ch['steps']}-step calls",
                f"{ch['produced_bytes']:,} B in {ch['produced_records']:,} records",
                f"{ch['produced_per_input_byte']:.2f}x",
                "",
                _met(None),
            )
        )
        per_call = ch["produced_records"] / ch["calls"]
        rows.append(
            (
                f"records produced per {ch['steps']}-step call, all topics",
                f"{ch['produced_records']:,} records / {ch['calls']} calls"
                f" ({ch['changelog_records']:,} changelog)",
                f"{per_call:.1f}",
                "<= 8" if ch["steps"] == 5 else "",
                _met(per_call <= 8) if ch["steps"] == 5 else _met(None),
            )
        )
    if "soak" in r:
        sk = r["soak"]
        rows.append(
            (
                f"RSS drift over {sk['seconds']:g}s at half load after warm-up",
                f"{sk['rss_first_kib']:,} -> {sk['rss_last_kib']:,} KiB (peak "
                f"{sk['rss_peak_kib']:,}; slope {sk['slope_pct_per_hour']} %/h)",
                f"{sk['drift_pct']} %",
                "< 2 %",
                _met(abs(sk["drift_pct"]) < 2),
            )
        )
    if "state" in r:
        a, b = r["state"]["small"]["events_per_s"], r["state"]["large"]["events_per_s"]
        if a and b:
            rows.append(
                (
                    f"events/s, {r['state']['large']['open_trajectories']:,} vs "
                    f"{r['state']['small']['open_trajectories']:,} open calls",
                    f"{b:,.0f} vs {a:,.0f} ev/s",
                    f"{b / a:.2f}",
                    "0.9 - 1.1",
                    _met(abs(b / a - 1) <= 0.1),
                )
            )
    sc = r.get("scaling", {})
    if sc:
        costs = {v["workers"]: v["cpu_s_per_1000_events"] for v in sc.values()}
        spread = max(costs.values()) / min(costs.values()) if min(costs.values()) > 0 else 0
        rows.append(
            (
                f"worker CPU s per 1,000 events, {'/'.join(map(str, sorted(costs)))} workers",
                " / ".join(f"{costs[n]:.2f}" for n in sorted(costs)) + " s",
                f"max/min {spread:.2f}",
                "<= 1.10",
                _met(spread <= 1.10),
            )
        )
        one, two = sc.get("workers_1", {}), sc.get("workers_2", {})
        e1, e2 = one.get("events_per_s"), two.get("events_per_s")
        if e1 and e2:
            rows.append(
                (
                    "throughput, two workers / one (2 shared cores)",
                    f"{e2:,.0f} / {e1:,.0f} ev/s",
                    f"{e2 / e1:.2f}",
                    "",
                    _met(None),
                )
            )
    return rows


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['cores']} cores, {m['ram_gib']} GiB, {m['arch']}, Python {m['python']}, "
        f"Kafka {m['kafka']}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, no soak: a smoke run")
    parser.add_argument("--only", help="comma-separated: " + ",".join(SCENARIOS))
    parser.add_argument(
        "--calls", type=int, default=None, help="calls per throughput run (5 events each)"
    )
    parser.add_argument(
        "--open-calls",
        type=int,
        default=None,
        help="memory: open calls of 1 event (of 10 events: a quarter of it)",
    )
    parser.add_argument(
        "--changelog-calls",
        type=int,
        default=None,
        help="changelog: calls of 5 steps (of 100 steps: a fiftieth of it, at least 2)",
    )
    parser.add_argument(
        "--scale-workers",
        type=lambda v: sorted({int(n) for n in v.split(",")}),
        default=[1, 2, 4],
        help="scaling: the worker counts to compare (default 1,2,4)",
    )
    parser.add_argument(
        "--floor-seconds",
        type=float,
        default=None,
        help="ceiling/faust: size the backlog so a run lasts at least this long (default 20; "
        "--quick: 0, one run)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="ceiling/faust: runs of the sized backlog, the median reported (default 3)",
    )
    parser.add_argument("--latency-seconds", type=float, default=None)
    parser.add_argument("--soak-seconds", type=float, default=1800)
    parser.add_argument(
        "--soak-rate",
        type=float,
        default=None,
        help="soak: events/s offered (default: half the pipeline's rate in this run, 250 "
        "without the pipeline scenario)",
    )
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    parser.add_argument(
        "--trace-memory",
        type=Path,
        metavar="DIR",
        help="run workers under tracemalloc (slower: not for timing) and write its top "
        "allocators to DIR: memory after warm-up and each shape, soak after warm-up, at "
        "minutes 6 and 16 and at the end",
    )
    parser.add_argument(
        "--trace-every",
        type=float,
        metavar="SECONDS",
        help="with --trace-memory: the soak's dumps every SECONDS after its base dump instead "
        "of at minutes 6 and 16 (with TRACE_CENSUS=1 a dump costs the worker nothing between "
        "dumps)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    a = parser.parse_args()
    a.calls = a.calls or (200 if a.quick else 4000)
    a.open_calls = a.open_calls or (400 if a.quick else 10_000)
    a.changelog_calls = a.changelog_calls or (40 if a.quick else 500)
    a.latency_seconds = a.latency_seconds or (5 if a.quick else 30)
    a.floor_seconds = a.floor_seconds if a.floor_seconds is not None else (0 if a.quick else 20)
    a.repeats = a.repeats if a.repeats is not None else (1 if a.quick else 3)
    if a.trace_memory:
        TRACE_DIR = a.trace_memory.resolve()
    if a.trace_every is not None:
        if a.trace_every <= 0 or not a.trace_memory:
            parser.error("--trace-every: a positive number of seconds, with --trace-memory")
        TRACE_EVERY_S = a.trace_every
    res = asyncio.run(main(a))
    table = Table(title=f"trajstream benchmark, {res['date']}, {machine_line(res['machine'])}")
    for col in ("measure", "figures", "result", "target", "met"):
        table.add_column(col)
    for row in res["verdicts"]:
        table.add_row(*row.values())
    # wide enough that a row reads on one line also when the output is not a terminal
    (console if console.is_terminal else Console(width=160)).print(table)
    console.print("durations (s):", res["durations_s"])
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = res["date"].replace(":", "").replace("+0000", "Z")
    for name in (f"{stamp}.json", "latest.json"):
        tmpf = a.out / f".{name}.tmp"
        tmpf.write_text(json.dumps(res, indent=2) + "\n")
        tmpf.replace(a.out / name)
    console.print(f"results: {a.out / 'latest.json'}")
