"""OTLP ingest benchmark: spans per second one ``trajstream otlp`` process ingests, and the
export latency at half that rate.

    .venv/bin/python bench/otlp.py                 # 20 s throughput, 20 s latency
    .venv/bin/python bench/otlp.py --quick         # a few seconds each (a smoke run)

It starts its own local Kafka broker (or uses KAFKA_BOOTSTRAP_SERVERS / --bootstrap) and one
``trajstream otlp`` process, and sends it protobuf export requests the way an SDK's batch span
processor does: each request holds ``--traces`` agent calls of four spans (``invoke_agent``,
two ``chat``, one ``execute_tool``; 1-3 KB of messages each), every trace new. A request counts
when it is answered 200, i.e. once the broker acknowledged its records.

1. throughput  ``--concurrency`` exporters sending back to back: spans/s
2. latency     requests sent open-loop at half the measured span rate: p50/p99/max of the
               request's round trip (what an exporter waits for)

The load generator runs in this process, on the same cores as the server and the broker, so
the figures are a floor. Results as a table and JSON (bench/results/otlp.json).
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
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streams.broker import LocalBroker  # noqa: E402

WORDS = "order parcel refund shipping invoice address delay carrier tracking support".split()


def _kv(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < size:
        out.append(rng.choice(WORDS))
    return " ".join(out)


def _messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


def trace_spans(rng: random.Random, now_ns: int) -> list[Span]:
    """One agent call: invoke_agent around chat, execute_tool, chat."""
    trace = rng.randbytes(16)
    ids = [rng.randbytes(8) for _ in range(4)]
    agent, chat1, tool, chat2 = ids
    question = _text(rng, rng.randint(300, 1500))

    def span(
        sid: bytes, parent: bytes, name: str, start: int, end: int, attrs: list[KeyValue]
    ) -> Span:
        s = Span(
            trace_id=trace,
            span_id=sid,
            parent_span_id=parent,
            name=name,
            kind=Span.SPAN_KIND_CLIENT,
            start_time_unix_nano=now_ns + start * 1_000_000,
            end_time_unix_nano=now_ns + end * 1_000_000,
            attributes=attrs,
        )
        s.status.code = Status.STATUS_CODE_OK
        return s

    def chat(sid: bytes, start: int, end: int, answer: str) -> Span:
        return span(
            sid,
            agent,
            "chat gpt-4o",
            start,
            end,
            [
                _kv("gen_ai.operation.name", "chat"),
                _kv("gen_ai.provider.name", "openai"),
                _kv("gen_ai.request.model", "gpt-4o"),
                _kv("gen_ai.response.model", "gpt-4o-2024-08-06"),
                _kv("gen_ai.response.id", f"chatcmpl-{uuid.UUID(bytes=rng.randbytes(16)).hex}"),
                _kv("gen_ai.usage.input_tokens", rng.randint(50, 900)),
                _kv("gen_ai.usage.output_tokens", rng.randint(10, 300)),
                _kv("gen_ai.input.messages", _messages("user", question)),
                _kv("gen_ai.output.messages", _messages("assistant", answer)),
            ],
        )

    return [
        chat(chat1, 5, 400, _text(rng, rng.randint(100, 600))),
        span(
            tool,
            agent,
            "execute_tool lookup",
            410,
            450,
            [
                _kv("gen_ai.operation.name", "execute_tool"),
                _kv("gen_ai.tool.name", "lookup_order"),
                _kv("gen_ai.tool.call.id", "call_1"),
                _kv("gen_ai.tool.call.arguments", '{"order": 42}'),
                _kv("gen_ai.tool.call.result", _text(rng, rng.randint(50, 400))),
            ],
        ),
        chat(chat2, 460, 900, _text(rng, rng.randint(100, 600))),
        span(
            agent,
            b"",
            "invoke_agent support",
            0,
            910,
            [
                _kv("gen_ai.operation.name", "invoke_agent"),
                _kv("gen_ai.agent.name", "support"),
                _kv("gen_ai.conversation.id", f"conv-{rng.randint(1, 10**6)}"),
            ],
        ),
    ]


def bodies(n: int, traces: int, rng: random.Random) -> list[bytes]:
    """``n`` distinct export requests of ``traces`` agent calls each."""
    now = time.time_ns()
    out = []
    for _ in range(n):
        request = ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        rs.resource.attributes.append(_kv("service.name", "bench-agent"))
        ss = rs.scope_spans.add()
        ss.scope.name = "bench"
        for _ in range(traces):
            ss.spans.extend(trace_spans(rng, now))
        out.append(request.SerializeToString())
    return out


class Server:
    """``trajstream otlp`` as a process on a free port."""

    def __init__(self, bootstrap: str, tmp: Path, resolve: str = "trace"):
        self.out = tmp / "otlp.out"
        self.log = tmp / "otlp.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
        env.update(
            TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
            TRAJSTREAM_KAFKA__TOPIC_PREFIX=f"bench{uuid.uuid4().hex[:8]}",
            TRAJSTREAM_OTLP__RESOLVE=resolve,
            PYTHONUNBUFFERED="1",
        )
        with self.out.open("wb") as stdout, self.log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streams.cli", "otlp", "--port", "0"],
                env=env,
                stdout=stdout,
                stderr=stderr,
                cwd=ROOT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while "/v1/traces" not in self.out.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"trajstream otlp did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        self.url = self.out.read_text().strip().splitlines()[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


HEADERS = {"Content-Type": "application/x-protobuf"}


async def _post(http: httpx.AsyncClient, url: str, body: bytes) -> tuple[float, int]:
    """One export: its round trip in seconds and the status. A 503 (Kafka slower than
    otlp.publish_timeout_s) is counted, as an exporter would retry it; anything else stops."""
    t = time.perf_counter()
    response = await http.post(url, content=body, headers=HEADERS)
    if response.status_code not in (200, 503):
        raise SystemExit(f"export answered {response.status_code}: {response.text[:300]}")
    return time.perf_counter() - t, response.status_code


async def throughput(
    url: str, payloads: list[bytes], spans_per: int, seconds: float, concurrency: int
) -> dict[str, Any]:
    sent = unavailable = 0
    stop_at = 0.0

    async def exporter(http: httpx.AsyncClient, k: int) -> None:
        nonlocal sent, unavailable
        i = k
        while time.monotonic() < stop_at:
            _, status = await _post(http, url, payloads[i % len(payloads)])
            if status == 200:
                sent += 1
            else:
                unavailable += 1
            i += concurrency

    async with httpx.AsyncClient(timeout=30) as http:
        await _post(http, url, payloads[0])  # warm-up: connection, producer metadata
        stop_at = time.monotonic() + seconds
        t0 = time.perf_counter()
        await asyncio.gather(*(exporter(http, k) for k in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "seconds": round(elapsed, 2),
        "requests": sent,
        "spans": sent * spans_per,
        "spans_per_s": round(sent * spans_per / elapsed, 1),
        "requests_per_s": round(sent / elapsed, 2),
        "unavailable_503": unavailable,
        "concurrency": concurrency,
    }


async def latency(
    url: str, payloads: list[bytes], spans_per: int, spans_per_s: float, seconds: float
) -> dict[str, Any]:
    interval = spans_per / spans_per_s
    n = max(10, int(seconds / interval))
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as http:
        t0 = time.monotonic()
        tasks = []
        for i in range(n):
            await asyncio.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            tasks.append(asyncio.create_task(_post(http, url, payloads[i % len(payloads)])))
        results = await asyncio.gather(*tasks)
    ms = sorted(s * 1000 for s, _ in results)  # a 503 counts with its time: the exporter waited
    return {
        "spans_per_s": round(spans_per_s, 1),
        "requests": n,
        "unavailable_503": sum(1 for _, status in results if status != 200),
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1),
        "max_ms": round(ms[-1], 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(1)
    seconds = 3.0 if args.quick else args.seconds
    payloads = bodies(16 if args.quick else 64, args.traces, rng)
    spans_per = 4 * args.traces
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "spans_per_request": spans_per,
        "resolve": args.resolve,
        "request_bytes": round(statistics.mean(len(p) for p in payloads)),
    }
    tmp = Path(tempfile.mkdtemp(prefix="trajstream-bench-otlp-"))
    broker: LocalBroker | None = None
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        broker = LocalBroker(
            Path(os.environ.get("TRAJSTREAM_CACHE_DIR", ROOT / ".cache" / "trajstream"))
        )
        bootstrap = broker.start(120)
    server = Server(bootstrap, tmp, args.resolve)
    try:
        results["throughput"] = await throughput(
            server.url, payloads, spans_per, seconds, args.concurrency
        )
        print("throughput", results["throughput"], flush=True)
        half = results["throughput"]["spans_per_s"] / 2
        results["latency"] = await latency(server.url, payloads, spans_per, half, seconds)
        print("latency", results["latency"], flush=True)
    finally:
        server.stop()
        if broker is not None:
            broker.stop()
    return results


def report(r: dict[str, Any]) -> None:
    t, lat = r["throughput"], r["latency"]
    rows = [
        ("OTLP ingest, one process", "value"),
        (f"spans/s ingested ({r['spans_per_request']} spans/request)", f"{t['spans_per_s']:,.0f}"),
        (f"export p50 at half rate ({lat['spans_per_s']:,.0f} spans/s)", f"{lat['p50_ms']} ms"),
        ("export p99 at half rate", f"{lat['p99_ms']} ms"),
        (
            "503 answers (throughput / latency runs)",
            f"{t['unavailable_503']} / {lat['unavailable_503']}",
        ),
    ]
    print()
    for name, value in rows:
        print(f"{name:<48} {value:>12}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds per measure")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each measure")
    parser.add_argument("--traces", type=int, default=32, help="agent calls per export request")
    parser.add_argument("--concurrency", type=int, default=4, help="exporters at once")
    parser.add_argument("--bootstrap", help="Kafka to use instead of a local broker")
    parser.add_argument(
        "--resolve",
        choices=("trace", "export"),
        default="trace",
        help="otlp.resolve of the ingest: trace fragments to <p>.spans (the default), or "
        "agent events mapped per export",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    out = asyncio.run(main(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "otlp.json").write_text(json.dumps(out, indent=2))
    report(out)
