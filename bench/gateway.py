"""trajstream gateway benchmark: the gateway against calling its upstream directly, in one run.

    python bench/gateway.py                    # 20 s per rate phase, a 10-minute RSS soak
    python bench/gateway.py --quick            # a few seconds each (a smoke run)
    python bench/gateway.py --bootstrap host:9092 --soak 120

It starts a Trinity stand-in process (serving as both upstreams: Trinity and production), a
`trajstream gateway` process in route mode (sampling:0.5, so half the calls go to each upstream
path) publishing to Kafka (its own local broker, or KAFKA_BOOTSTRAP_SERVERS / --bootstrap), and
drives both from this process with aiohttp. It reports, as a table and as JSON
(bench/results/gateway-latest.json):

1. max rate    closed loop, --concurrency requests in flight: requests/s through the gateway,
               straight to the stand-in (the upstream's own ceiling, for context), and through
               the floor: a bare aiohttp proxy on uvloop (bench/proxy_floor.py: no parsing, no
               recording), what any gateway in one Python process costs on this machine
2. latency     open loop at each --rates: p50/p99 through the gateway, the floor and direct at
               the same rate, each path after --warmup seconds (2) at that rate that are not
               counted (its connections opened: client to proxy, proxy to upstream); "added"
               is the difference to direct
3. rss         the gateway's RSS (its process and the recorder's) sampled every second over a
               --soak run at that rate,
               each call ended with /end as agents do: first, max, last, and last minus the
               value after the first tenth of the run

Each request is one step of a call named in the path (/calls/<id>/v1/chat/completions), a
~1 KB chat body; every answer is recorded (START and one step per call on the agent-events
topic). Figures are from this machine in this run. Targets (issue 19): added p50 <= 0.5 ms and
p99 <= 5 ms at 500 requests/s, p99 <= 10 ms at 1,000; >= 2,000 requests/s recorded per process
with nothing spilled while the broker is healthy; RSS flat (< 2%) over a 30-minute soak.

4. fallback    the policy failing: three gateway processes routing half the calls to the policy
               (sampling:0.5), whose Trinity is a closed port (each such request falls back on
               the refused connection; the breaker held shut), a stand-in answering 503
               (likewise), and a closed port behind an open breaker (no request to Trinity at
               all); open loop at --fallback-rate (200 req/s) on each, the three interleaved a
               second at a time: in each, the p50/p99 of the calls that fell back against
               those routed to production in the same seconds
5. paired      with --baseline DIR (a checkout of another version of this repository, e.g. the
               code before a change: ``git archive <commit> | tar -x -C DIR``): its gateway and
               this one, same settings, and the direct path, each at the first --rates,
               interleaved a second at a time, in --rounds rounds: the added p50/p99 before and
               after, their paired difference per round, and each serving process's CPU per
               request

Also: ``--durability acked`` (the cost of answering only once the broker acknowledged),
``--rates`` (the open-loop phases), and the gateway's own overhead histogram
(``trajstream_gateway_overhead_seconds`` on its /metrics: the time apart from the upstream's, by
bucket) beside the difference of the two paths; ``--py-spy FILE`` profiles the gateway
(its serving process and its recorder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from streams.broker import LocalBroker, free_port  # noqa: E402

BODY = {
    "model": "bench-model",
    "messages": [
        {"role": "system", "content": "You are a support agent for an online shop. " * 8},
        {"role": "user", "content": "Where is my order 12345? It was due yesterday. " * 6},
    ],
    "temperature": 0.2,
}


FAILED: dict[str, int] = {}
"""Open-loop requests that failed (connection refused or reset, a non-200), by URL pattern."""


def spawn(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, **kwargs)  # started once, before anything is measured


def rss_kib(pid: int, children: bool = True) -> int:
    """The RSS of ``pid`` and (with ``children``) of its child processes (the recorder)."""
    total = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total = int(line.split()[1])
        if children:
            for task in Path(f"/proc/{pid}/task").iterdir():
                for child in (task / "children").read_text().split():
                    total += rss_kib(int(child))
    except FileNotFoundError:  # gone meanwhile
        pass
    return total


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of ``pid`` and of its child processes (the recorder) so far:
    the work per request, whatever else the machine runs."""
    own = children = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / tick
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                children += sum(cpu_s(int(child)))
    except FileNotFoundError:  # gone meanwhile
        pass
    return own, children


async def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not answer in {timeout}s")


async def one(http: aiohttp.ClientSession, url: str, data: bytes, end: str | None = None) -> float:
    """One chat request of a fresh call (timed); with ``end``, then that call's /end (untimed)."""
    cid = uuid.uuid4().hex
    began = time.perf_counter()
    async with http.post(
        url.format(cid), data=data, headers={"Content-Type": "application/json"}
    ) as r:
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
    took = (time.perf_counter() - began) * 1000
    if end is not None:
        async with http.post(end.format(cid)) as r:
            await r.read()
    return took


async def max_rate(url: str, seconds: float, concurrency: int) -> float:
    data = json.dumps(BODY).encode()
    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def loop() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await one(http, url, data)
                done += 1

        began = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return done / (time.perf_counter() - began)


async def at_rate(
    url: str,
    rate: float,
    seconds: float,
    on_tick: Any = None,
    end: str | None = None,
    warmup: float = 0.0,
    counting: Any = None,
) -> list[float]:
    """Open loop: one request every 1/rate s, each timed from its send; the requests of the
    first ``warmup`` seconds (the connections being opened, client to proxy and proxy to
    upstream) are sent at the same rate but not counted; ``counting()`` is called as the
    first counted request is sent."""
    data = json.dumps(BODY).encode()
    latencies: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as http:

        async def send(counted: bool) -> None:
            try:
                latency = await one(http, url, data, end)
            except (aiohttp.ClientError, RuntimeError):  # refused or reset under overload
                FAILED[url] = FAILED.get(url, 0) + 1
                return
            if counted:
                latencies.append(latency)

        t0 = time.perf_counter()
        warm = int(rate * warmup)
        n = warm + int(rate * seconds)
        next_tick = t0
        for i in range(n):
            target = t0 + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if i == warm and counting is not None:
                counting()
            task = asyncio.create_task(send(i >= warm))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if on_tick is not None and time.perf_counter() >= next_tick:
                on_tick()
                next_tick += 1.0
        await asyncio.gather(*tasks)
    return latencies


async def overhead_buckets(gateway: str) -> dict[float, float]:
    """The gateway's own ``trajstream_gateway_overhead_seconds`` histogram (chat requests):
    cumulative count per upper bound."""
    async with aiohttp.ClientSession() as http, http.get(f"{gateway}/metrics") as r:
        text = await r.text()
    out: dict[float, float] = {}
    for line in text.splitlines():
        if (
            line.startswith("trajstream_gateway_overhead_seconds_bucket{")
            and 'route="chat"' in line
        ):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> Any:
    """The upper bound (ms) of the bucket holding the q-quantile of what was observed between
    the two readings; None when nothing was."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for le, count in delta.items():
        if count >= q * total:
            return "inf" if le == float("inf") else le * 1000
    return None


async def health_of(gateway: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{gateway}/healthz") as r:
        return dict(await r.json())


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


BREAKER_HELD_SHUT = {  # the breaker never opens: every request tries the policy first
    "TRAJSTREAM_GATEWAY__BREAKER__FAILURES": "1000000000",
    "TRAJSTREAM_GATEWAY__BREAKER__MIN_REQUESTS": "1000000000",
}


def start_gateway(
    env: dict[str, str], tmp: Path, name: str, upstream: str, cwd: Path = REPO
) -> tuple[subprocess.Popen[bytes], str]:
    """A ``trajstream gateway`` process of the code in ``cwd``, its production ``upstream``."""
    port = free_port()
    proc = spawn(
        [sys.executable, "-m", "streams.cli", "gateway", "--port", str(port),
         "--production-url", f"{upstream}/v1"],
        cwd=cwd,
        env={**env, "TRAJSTREAM_GATEWAY__SPILL_DIR": str(tmp / f"spill-{name}")},
        stdout=(tmp / f"gateway-{name}.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def summary(latencies: list[float]) -> dict[str, Any]:
    return {"p50": pct(latencies, 50), "p99": pct(latencies, 99), "n": len(latencies)}


async def interleaved(
    urls: dict[str, str], rate: float, seconds: float, warmup: float, slice_s: float = 1.0
) -> dict[str, dict[str, list[float]]]:
    """Open loop at ``rate`` on each of ``urls`` in turn, ``slice_s`` at a time, until each had
    ``seconds`` (after ``warmup`` seconds each, not counted): every path sees the machine as it
    was a second before or after the others, so a load that drifts moves them alike. Each
    request's latency is kept under the gateway's ``X-Trajstream-Fallback`` (``production``
    when the call was routed to production, ``trinity`` when the policy answered)."""
    data = json.dumps(BODY).encode()
    out: dict[str, dict[str, list[float]]] = {name: {} for name in urls}
    sessions = {
        name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) for name in urls
    }
    tasks: set[asyncio.Task[None]] = set()

    async def send(name: str, counted: bool) -> None:
        began = time.perf_counter()
        try:
            async with sessions[name].post(
                urls[name].format(uuid.uuid4().hex),
                data=data,
                headers={"Content-Type": "application/json"},
            ) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}")
                took = (time.perf_counter() - began) * 1000
                key = r.headers.get("X-Trajstream-Fallback") or r.headers.get(
                    "X-Trajstream-Upstream", "direct"
                )
        except (aiohttp.ClientError, RuntimeError):
            FAILED[urls[name]] = FAILED.get(urls[name], 0) + 1
            return
        if counted:
            out[name].setdefault(key, []).append(took)

    async def run(name: str, length: float, counted: bool) -> None:
        t0 = time.perf_counter()
        for i in range(int(rate * length)):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send(name, counted))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    try:
        for name in urls:
            await run(name, warmup, counted=False)
        order = list(urls)
        for n in range(max(1, round(seconds / slice_s))):
            for name in order if n % 2 == 0 else reversed(order):
                await run(name, slice_s, counted=True)
        await asyncio.gather(*tasks)
    finally:
        for session in sessions.values():
            await session.close()
    return out


async def fallback_phase(
    args: argparse.Namespace, env: dict[str, str], tmp: Path, upstream: str, procs: list[Any]
) -> dict[str, Any]:
    """The policy failing (see the module docstring, 4.): three gateways routing half the calls
    to the policy, each failing its own way, their requests interleaved; in each, the calls
    that fell back against those routed to production in the same seconds."""
    failing_port = free_port()
    procs.append(
        spawn(
            [sys.executable, "-m", "streams.cli", "standin", "--port", str(failing_port)],
            cwd=REPO,
            env=env,
            stdout=(tmp / "standin-503.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
    )
    failing = f"http://127.0.0.1:{failing_port}"
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    half = {**env, "TRAJSTREAM_SELECTION__STRATEGY": "sampling:0.5"}
    paths = {
        "refused": {**half, "TRAJSTREAM_TRINITY__URL": closed, **BREAKER_HELD_SHUT},
        "status_503": {**half, "TRAJSTREAM_TRINITY__URL": failing, **BREAKER_HELD_SHUT},
        "breaker_open": {
            **half,
            "TRAJSTREAM_TRINITY__URL": closed,
            "TRAJSTREAM_GATEWAY__BREAKER__FAILURES": "1",
            "TRAJSTREAM_GATEWAY__BREAKER__COOLDOWN_S": "86400",
            "TRAJSTREAM_GATEWAY__BREAKER__MAX_COOLDOWN_S": "86400",
        },
    }
    urls = {}
    for name, path_env in paths.items():
        proc, url = start_gateway(path_env, tmp, name, upstream)
        procs.append(proc)
        urls[name] = url
    await wait_http(f"{failing}/health")
    async with aiohttp.ClientSession() as http:
        fault = {"mode": "error", "status": 503}
        async with http.post(f"{failing}/_standin/chat-fault", json=fault) as r:
            assert r.status == 200, await r.text()
    for url in urls.values():
        await wait_http(f"{url}/healthz")
    reasons = {"refused": "connect", "status_503": "status_5xx", "breaker_open": "breaker_open"}
    got = await interleaved(
        {name: f"{url}/calls/{{}}/v1/chat/completions" for name, url in urls.items()},
        args.fallback_rate,
        args.seconds,
        args.warmup,
    )
    out: dict[str, Any] = {"rate_rps": args.fallback_rate, "seconds": args.seconds}
    for name, url in urls.items():
        fell, base = summary(got[name].get(reasons[name], [])), summary(
            got[name].get("production", [])
        )
        health = (await health_of(url))["policy"]
        out[name] = {
            "fallback": fell,
            "production": base,
            "added_p50": fell["p50"] - base["p50"],
            "added_p99": fell["p99"] - base["p99"],
            "breaker": health["state"],
            "fallbacks": health["fallbacks"],
            "failed": FAILED.get(f"{url}/calls/{{}}/v1/chat/completions", 0),
        }
    return out


PAIRED_KEYS = (
    "before_added_p50",
    "before_added_p99",
    "after_added_p50",
    "after_added_p99",
    "paired_p50",
    "paired_p99",
    "before_cpu_ms",
    "after_cpu_ms",
    "paired_cpu_ms",
)


async def paired_phase(
    args: argparse.Namespace,
    env: dict[str, str],
    tmp: Path,
    upstream: str,
    gateway: str,
    gateway_pid: int,
    procs: list[Any],
) -> dict[str, Any]:
    """This gateway against --baseline's at the same rate (see the module docstring, 5.): the
    direct path and the two gateways interleaved a second at a time, each at the full rate,
    for --rounds rounds of --seconds each."""
    baseline_dir = args.baseline.resolve()
    proc, baseline = start_gateway(
        {**env, "PYTHONPATH": str(baseline_dir)}, tmp, "baseline", upstream, cwd=baseline_dir
    )
    procs.append(proc)
    await wait_http(f"{baseline}/healthz")
    rate = args.rates[0]
    bases = {"after": gateway, "before": baseline}
    pids = {"after": gateway_pid, "before": proc.pid}
    urls = {
        "direct": f"{upstream}/v1/chat/completions?call={{}}",
        **{name: f"{url}/calls/{{}}/v1/chat/completions" for name, url in bases.items()},
    }
    rounds = []
    for _ in range(args.rounds):
        served = {name: (await health_of(url))["requests"] for name, url in bases.items()}
        cpu = {name: cpu_s(pid)[0] for name, pid in pids.items()}
        got = await interleaved(urls, rate, args.seconds, args.warmup)
        direct = summary([ms for lat in got["direct"].values() for ms in lat])
        row: dict[str, Any] = {"direct": direct}
        for name, url in bases.items():
            mine = summary([ms for lat in got[name].values() for ms in lat])
            n = (await health_of(url))["requests"] - served[name]
            row[name] = mine
            row[f"{name}_added_p50"] = mine["p50"] - direct["p50"]
            row[f"{name}_added_p99"] = mine["p99"] - direct["p99"]
            # the serving process's CPU per request (its recorder's apart): the work it adds
            row[f"{name}_cpu_ms"] = (cpu_s(pids[name])[0] - cpu[name]) * 1000 / max(1, n)
        row["paired_p50"] = row["after_added_p50"] - row["before_added_p50"]
        row["paired_p99"] = row["after_added_p99"] - row["before_added_p99"]
        row["paired_cpu_ms"] = row["after_cpu_ms"] - row["before_cpu_ms"]
        rounds.append(row)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    return {
        "rate_rps": rate,
        "baseline": str(args.baseline),
        "rounds": rounds,
        "median": {key: median(key) for key in PAIRED_KEYS},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="trajstream-gw-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    profiled: list[subprocess.Popen[bytes]] = []  # the gateway under py-spy
    broker = None
    bootstrap = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    try:
        if not bootstrap:
            broker = LocalBroker(REPO / ".cache" / "trajstream")
            bootstrap = broker.start(120)
        standin_port, gateway_port, floor_port = free_port(), free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
        procs.append(
            spawn(
                [sys.executable, "-m", "streams.cli", "standin", "--port", str(standin_port)],
                cwd=REPO,
                env=env,
                stdout=(tmp / "standin.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
        upstream = f"http://127.0.0.1:{standin_port}"
        procs.append(  # the floor: a bare aiohttp proxy (bench/proxy_floor.py)
            spawn(
                [
                    sys.executable,
                    str(REPO / "bench" / "proxy_floor.py"),
                    "--port",
                    str(floor_port),
                    "--upstream",
                    upstream,
                ],
                cwd=REPO,
                env=env,
                stdout=(tmp / "floor.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
        floor = f"http://127.0.0.1:{floor_port}"
        env.update(
            TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
            TRAJSTREAM_KAFKA__TOPIC_PREFIX=f"gwbench{uuid.uuid4().hex[:6]}",
            TRAJSTREAM_TRINITY__URL=upstream,
            TRAJSTREAM_SELECTION__STRATEGY="sampling:0.5",
            TRAJSTREAM_GATEWAY__SPILL_DIR=str(tmp / "spill"),
            TRAJSTREAM_GATEWAY__DURABILITY=args.durability,
        )
        if args.recorder:  # else the gateway's default (process)
            env["TRAJSTREAM_GATEWAY__RECORDER"] = args.recorder
        profiler = (
            # --subprocesses: the recorder process too (its stacks under its own root frame)
            [
                *("py-spy", "record", "--subprocesses", "--format", "raw", "--rate", "250"),
                *("-o", str(args.py_spy), "--"),
            ]
            if args.py_spy
            else []
        )
        gw = spawn(
            [
                *profiler,
                sys.executable,
                "-m",
                "streams.cli",
                "gateway",
                "--port",
                str(gateway_port),
                "--production-url",
                f"{upstream}/v1",
            ],
            cwd=REPO,
            env=env,
            stdout=(tmp / "gateway.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        procs.append(gw)
        profiled.append(gw)
        gateway = f"http://127.0.0.1:{gateway_port}"
        await wait_http(f"{upstream}/health")
        await wait_http(f"{gateway}/healthz")
        await wait_http(f"{floor}/healthz")
        direct_url = f"{upstream}/v1/chat/completions?call={{}}"
        floor_url = f"{floor}/v1/chat/completions?call={{}}"
        gateway_url = f"{gateway}/calls/{{}}/v1/chat/completions"

        gw_max = direct_max = floor_max = None
        recorded: dict[str, Any] = {}
        by_rate: list[dict[str, Any]] = []
        paired = fallback = None
        if args.baseline is not None:
            paired = await paired_phase(args, env, tmp, upstream, gateway, gw.pid, procs)
            print("paired:", json.dumps(paired["median"]), flush=True)
        if not args.soak_only and not args.no_fallback:
            fallback = await fallback_phase(args, env, tmp, upstream, procs)
            print("fallback:", json.dumps(fallback), flush=True)
        if not args.soak_only and not args.policy_only:
            await max_rate(gateway_url, min(2.0, args.seconds), args.concurrency)  # warm up
            before = (await health_of(gateway))["publisher"]
            cpu_before, served_before = cpu_s(gw.pid), (await health_of(gateway))["requests"]
            gw_max = await max_rate(gateway_url, args.seconds, args.concurrency)
            after = (await health_of(gateway))["publisher"]
            served = (await health_of(gateway))["requests"] - served_before
            cpu_after = cpu_s(gw.pid)
            recorded = {  # START and one step a call, recorded while the phase ran
                "records_per_s": round(
                    (after["published"] - before["published"]) / args.seconds, 1
                ),
                "spilled_during_max_rate": after["spilled_total"] - before["spilled_total"],
                "buffered_at_end": after["buffered"],
                # CPU per request during the phase: the serving process; its recorder process
                "cpu_ms_per_request": {
                    "serving": round((cpu_after[0] - cpu_before[0]) * 1000 / max(1, served), 3),
                    "recorder": round((cpu_after[1] - cpu_before[1]) * 1000 / max(1, served), 3),
                },
            }
            direct_max = await max_rate(direct_url, args.seconds, args.concurrency)
            floor_max = await max_rate(floor_url, args.seconds, args.concurrency)
            for rate in args.rates:
                direct = await at_rate(direct_url, rate, args.seconds, warmup=args.warmup)
                bare = await at_rate(floor_url, rate, args.seconds, warmup=args.warmup)
                # the gateway's histogram read as the counted requests begin, and after them
                read: list[asyncio.Task[dict[float, float]]] = []
                through = await at_rate(
                    gateway_url,
                    rate,
                    args.seconds,
                    warmup=args.warmup,
                    counting=lambda into=read: into.append(
                        asyncio.create_task(overhead_buckets(gateway))
                    ),
                )
                hist = await read[0] if read else await overhead_buckets(gateway)
                hist_after = await overhead_buckets(gateway)
                by_rate.append(
                    {
                        "rate_rps": rate,
                        "direct": {
                            "p50": pct(direct, 50),
                            "p99": pct(direct, 99),
                            "n": len(direct),
                        },
                        "gateway": {
                            "p50": pct(through, 50),
                            "p99": pct(through, 99),
                            "n": len(through),
                        },
                        "floor": {"p50": pct(bare, 50), "p99": pct(bare, 99), "n": len(bare)},
                        "added_p50": pct(through, 50) - pct(direct, 50),
                        "added_p99": pct(through, 99) - pct(direct, 99),
                        "floor_added_p50": pct(bare, 50) - pct(direct, 50),
                        "floor_added_p99": pct(bare, 99) - pct(direct, 99),
                        "overhead_histogram_ms": {
                            "p50_at_most": bucket_quantile(hist, hist_after, 0.5),
                            "p99_at_most": bucket_quantile(hist, hist_after, 0.99),
                        },
                    }
                )
        rate = args.rates[0]

        samples: list[tuple[float, int]] = []
        began = time.monotonic()
        if not args.policy_only:
            await at_rate(
                gateway_url,
                rate,
                args.soak,
                end=f"{gateway}/calls/{{}}/end",
                on_tick=lambda: samples.append((time.monotonic() - began, rss_kib(gw.pid))),
            )
        async with aiohttp.ClientSession() as http, http.get(f"{gateway}/healthz") as r:
            health = await r.json()
        tenth = next((kib for t, kib in samples if t >= args.soak / 10), samples[0][1]) if (
            samples
        ) else None
        result = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
            "seconds": args.seconds,
            "concurrency": args.concurrency,
            "durability": args.durability,
            "recorder": args.recorder,
            "warmup_s": args.warmup,
            "load_average": os.getloadavg(),
            "max_rate": {
                "gateway_rps": gw_max and round(gw_max, 1),
                "direct_rps": direct_max and round(direct_max, 1),
                "floor_rps": floor_max and round(floor_max, 1),
            },
            "recorded": recorded,
            "latency_ms": by_rate[0] if by_rate else None,
            "latency_by_rate": by_rate,
            "fallback_ms": fallback,
            "paired_ms": paired,
            "rss_kib": {
                "soak_s": args.soak,
                "first": samples[0][1] if samples else None,
                "after_first_tenth": tenth,
                "max": max(k for _, k in samples) if samples else None,
                "last": samples[-1][1] if samples else None,
                "drift_after_first_tenth": samples[-1][1] - tenth if samples and tenth else None,
                "curve": [(round(t), kib) for t, kib in samples[::60]],  # one a minute
            },
            "gateway_health": health,
            "failed_requests": dict(FAILED),
        }
        return result
    finally:
        for p in procs:
            # py-spy writes its profile on SIGINT (and stops the gateway under it)
            p.send_signal(signal.SIGINT) if args.py_spy and p in profiled else p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        if broker is not None:
            broker.stop()


def report(result: dict[str, Any]) -> None:
    mx, rss, rec = result["max_rate"], result["rss_kib"], result["recorded"]
    print(
        f"durability {result['durability']}, recorder {result.get('recorder')}, load average "
        + " ".join(f"{x:.1f}" for x in result["load_average"])
    )
    if mx["gateway_rps"] is not None:  # not --soak-only
        print(
            f"max rate      gateway {mx['gateway_rps']:8.1f} req/s   "
            f"direct {mx['direct_rps']:8.1f} req/s   floor (bare aiohttp proxy) "
            f"{mx.get('floor_rps', float('nan')):8.1f} req/s   "
            f"(concurrency {result['concurrency']})"
        )
        print(
            f"recorded      {rec['records_per_s']:.1f} records/s during the max-rate phase, "
            f"{rec['spilled_during_max_rate']} spilled, {rec['buffered_at_end']} buffered at its "
            "end"
        )
        cpu = rec["cpu_ms_per_request"]
        print(
            f"cpu/request   serving process {cpu['serving']:.3f} ms, recorder process "
            f"{cpu['recorder']:.3f} ms (during the max-rate phase)"
        )
    for lat in result["latency_by_rate"]:
        h = lat["overhead_histogram_ms"]
        print(
            f"latency @ {lat['rate_rps']:.0f} req/s (after {result.get('warmup_s', 0):g} s of "
            f"warm-up)   direct p50 {lat['direct']['p50']:.2f} ms "
            f"p99 {lat['direct']['p99']:.2f} ms | gateway p50 {lat['gateway']['p50']:.2f} ms "
            f"p99 {lat['gateway']['p99']:.2f} ms | added p50 {lat['added_p50']:.2f} ms "
            f"p99 {lat['added_p99']:.2f} ms | overhead (own histogram) p50 <= {h['p50_at_most']}"
            f" ms, p99 <= {h['p99_at_most']} ms"
        )
        print(
            f"    floor (bare aiohttp proxy) p50 {lat['floor']['p50']:.2f} ms p99 "
            f"{lat['floor']['p99']:.2f} ms | added by any Python proxy here p50 "
            f"{lat['floor_added_p50']:.2f} ms p99 {lat['floor_added_p99']:.2f} ms"
        )
    fb = result.get("fallback_ms")
    if fb:
        print(
            f"fallback @ {fb['rate_rps']:.0f} req/s per gateway, half the calls routed to the "
            f"policy, {fb['seconds']:g} s each, the three interleaved:"
        )
        for name in ("refused", "status_503", "breaker_open"):
            x = fb[name]
            f, p = x["fallback"], x["production"]
            print(
                f"    {name:13} fell back p50 {f['p50']:7.2f} ms p99 {f['p99']:7.2f} ms (n "
                f"{f['n']}) | production's p50 {p['p50']:7.2f} ms p99 {p['p99']:7.2f} ms (n "
                f"{p['n']}) | added p50 {x['added_p50']:+.2f} ms p99 {x['added_p99']:+.2f} ms | "
                f"breaker {x['breaker']}, fallbacks {x['fallbacks']}"
            )
    pr = result.get("paired_ms")
    if pr:
        m = pr["median"]
        print(
            f"paired @ {pr['rate_rps']:.0f} req/s, this gateway against {pr['baseline']} "
            f"(median of {len(pr['rounds'])} rounds): added p50 before {m['before_added_p50']:.2f}"
            f" ms, after {m['after_added_p50']:.2f} ms; added p99 before "
            f"{m['before_added_p99']:.2f} ms, after {m['after_added_p99']:.2f} ms; paired "
            f"difference (after - before) p50 {m['paired_p50']:+.2f} ms, p99 "
            f"{m['paired_p99']:+.2f} ms; serving CPU per request before {m['before_cpu_ms']:.3f}"
            f" ms, after {m['after_cpu_ms']:.3f} ms ({m['paired_cpu_ms']:+.3f} ms)"
        )
        for n, r in enumerate(pr["rounds"]):
            print(
                f"    round {n}: direct p50 {r['direct']['p50']:.2f} p99 {r['direct']['p99']:.2f}"
                f" | added before p50 {r['before_added_p50']:.2f} p99 "
                f"{r['before_added_p99']:.2f} | after p50 {r['after_added_p50']:.2f} p99 "
                f"{r['after_added_p99']:.2f} ms"
            )
    if not rss["first"]:
        return
    print(
        f"gateway RSS over {rss['soak_s']:g} s: first {rss['first']} KiB, after 1/10 "
        f"{rss['after_first_tenth']} KiB, max {rss['max']} KiB, last {rss['last']} KiB "
        f"(drift {rss['drift_after_first_tenth']} KiB)"
    )
    print("RSS each minute (s, KiB): " + " ".join(f"{t}:{k}" for t, k in rss["curve"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 s phases, 5 s soak")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each rate phase")
    parser.add_argument("--soak", type=float, default=600.0, help="length of the RSS soak")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds at each open-loop rate before the counted requests, on every path "
        "(default 2; --quick: 0.5; 0: none)",
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--rates",
        type=lambda v: [float(x) for x in v.split(",")],
        default=None,
        help="open-loop latency phases, requests/s (default 500,1000; --quick: 200)",
    )
    parser.add_argument("--durability", choices=("buffered", "acked"), default="buffered")
    parser.add_argument(
        "--soak-only",
        action="store_true",
        help="only the RSS soak at the first --rates (no max-rate or latency phases): a long "
        "soak that does not load the machine past that rate",
    )
    parser.add_argument(
        "--recorder",
        choices=("process", "loop"),
        default=None,
        help="gateway.recorder: records built and sent by a child process (the default), or on "
        "the serving loop",
    )
    parser.add_argument(
        "--fallback-rate",
        type=float,
        default=200.0,
        help="the open-loop rate of the fallback phase (requests/s)",
    )
    parser.add_argument(
        "--no-fallback", action="store_true", help="leave out the fallback phase"
    )
    parser.add_argument(
        "--policy-only",
        action="store_true",
        help="only the fallback phase and (with --baseline) the paired one: no max-rate, "
        "latency or soak phases",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of the fallback and paired phases, the paths interleaved (default 3; "
        "--quick: 1)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a checkout of another version of this repository: its gateway measured against "
        "this one's at the first --rates, paired round by round",
    )
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="run the gateway under `py-spy record --subprocesses --format raw` into this file "
        "(the serving process and its recorder, each under its own root frame; profiling: "
        "the figures are not the gateway's own; RSS and CPU are then py-spy's)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    if args.quick:  # explicit --seconds / --soak still win
        args.seconds = args.seconds if "--seconds" in sys.argv else 3.0
        args.soak = args.soak if "--soak" in sys.argv else 5.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 2.0
    if args.rates is None:
        args.rates = [200.0] if args.quick else [500.0, 1000.0]
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    result = asyncio.run(main(args))
    report(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gateway-latest.json").write_text(json.dumps(result, indent=2))
