"""Metrics, health, ``trajstream status`` and the status page, on a real run.

A real worker process (real broker, the stand-in over real HTTP) serves ``/metrics``,
``/healthz`` and ``/readyz``; its counters are read with prometheus_client's own parser and
checked against the traffic that was sent. ``trajstream status --json`` runs as a real command.
The status page is loaded in a real headless Chromium (Debian's ``chromium``): the plot must
show the run's reward windows, and a call's page its steps and reward components.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import sys
import tempfile

import httpx
import pytest
from aiohttp import web
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from streams.devtools.broker import free_port
from streams.devtools.traffic import AGENTS, simulate_call
from streams.io.trinity import TrinityClient
from streams.models import CommitRecord, DeadLetter, WindowSummary
from streams.observe.pages import application
from streams.sdk import TrajstreamProducer
from streams.settings import Settings

from .conftest import REPO_ROOT, read_topic, wait_for

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = os.environ.get("TRAJSTREAM_STATUS_SCREENSHOT")  # set to save the page's image


async def _traffic(bootstrap, prefix, standin, calls, *, pause=0.0, seed=3):
    rng = random.Random(seed)
    agents = list(AGENTS)[:2]
    out = []
    async with (
        TrajstreamProducer(bootstrap, topic_prefix=prefix) as producer,
        TrinityClient(standin.url) as trinity,
    ):
        for i in range(calls):
            out.append(
                await simulate_call(
                    producer,
                    trinity,
                    rng,
                    agent=agents[i % len(agents)],
                    fail=i % 4 == 3,
                    llm_steps=2,
                    rating=4.0 if i % 2 else None,
                )
            )
            if pause:
                await asyncio.sleep(pause)
    return out


async def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(timeout=5) as client:
        reply = await client.get(f"{url}/metrics")
    reply.raise_for_status()
    assert reply.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


LAG = "trajstream_consumer_lag_records"


def _sum(samples, name: str, **labels: str) -> float:
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all((k, val) in ls for k, val in labels.items())
    )


async def _cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
        *args,
        env=env,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _get(client: httpx.AsyncClient, url: str) -> httpx.Response | None:
    """GET ``url``; None while the worker's server does not answer (not up yet, or gone)."""
    try:
        return await client.get(url)
    except httpx.TransportError:
        return None


async def _until(client: httpx.AsyncClient, url: str, status: int, other: int) -> httpx.Response:
    """Poll ``url`` (for up to 30 s) until it answers ``status``; until then it may answer
    ``other`` or nothing. Returns that answer."""
    answer = None
    for _ in range(150):
        answer = await _get(client, url)
        if answer is not None and answer.status_code == status:
            return answer
        assert answer is None or answer.status_code == other, answer
        await asyncio.sleep(0.2)
    raise AssertionError(f"{url} never answered {status} (last: {answer})")


async def test_worker_metrics_health_and_status(kafka_bootstrap, prefix, standin, workers):
    port = free_port()
    worker = workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=2,
        TRAJSTREAM_OBSERVE__HOST="127.0.0.1",
        TRAJSTREAM_OBSERVE__PORT=port,
        TRAJSTREAM_OBSERVE__LAG_INTERVAL_S=1,
        TRAJSTREAM_OBSERVE__STATUS_PAGE="true",
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=5) as client:
        ready = await _until(client, f"{url}/readyz", 200, 503)
        assert ready.json()["assigned_partitions"] == 4 * 6 + 1  # 6 keyed inputs + the ledger
        alive = await _get(client, f"{url}/healthz")
        assert alive is not None and alive.status_code == 200

    sims = await _traffic(kafka_bootstrap, prefix, standin, calls=8)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:  # one undecodable record: a dead letter, counted, and the worker goes on
        await producer.send_and_wait(f"{prefix}.agent-events", b"not avro", key=b"junk")
    finally:
        await producer.stop()
    msg_ids = {m for s in sims for m in s.msg_ids}
    await wait_for(lambda: set(standin.state.trained) >= msg_ids, 90, "every call committed")

    samples: dict = {}

    async def settled() -> bool:
        nonlocal samples
        samples = await _scrape(url)
        # the lag gauge is refreshed every observe.lag_interval_s from the highwaters the
        # fetcher has seen: a run that settles within one interval of the first fetch (seen in
        # CI: 0.6 s from ready to the first commit) is scraped before it is set
        lagged = {dict(ls)["topic"] for n, ls in samples if n == LAG}
        return (
            _sum(samples, "trajstream_decisions_total") == len(sims)
            and _sum(samples, "trajstream_commits_total", result="sent") >= 1
            and _sum(samples, "trajstream_dead_letters_total") == 1
            and f"{prefix}.agent-events" in lagged
        )

    for _ in range(50):
        if await settled():
            break
        await asyncio.sleep(0.3)
    assert _sum(samples, "trajstream_decisions_total", decision="selected", reason="sampled") == 8
    assert _sum(samples, "trajstream_dead_letters_total", stage="assemble") == 1
    # 2 LLM steps and 1 tool step per call, its start and end: 5 events, and the bad record
    assert _sum(samples, "trajstream_events_in_total", topic=f"{prefix}.agent-events") == 8 * 5 + 1
    assert _sum(samples, "trajstream_events_in_total", topic=f"{prefix}.user-feedback") == 4
    assert _sum(samples, "trajstream_feedback_latency_seconds_count") == 8
    assert _sum(samples, "trajstream_feedback_latency_seconds_sum") > 0
    assert _sum(samples, "trajstream_trinity_errors_total") == 0
    assert _sum(samples, "trajstream_open_calls") == 0
    assert _sum(samples, "trajstream_ready") == 1
    assert 0 <= _sum(samples, "trajstream_seconds_since_last_commit") < 60
    lag_topics = {dict(ls)["topic"] for n, ls in samples if n == LAG}
    assert f"{prefix}.agent-events" in lag_topics
    assert not any(t.endswith("-changelog") for t in lag_topics)
    windows = {
        dict(ls)["agent"]: v
        for (n, ls), v in samples.items()
        if n == "trajstream_reward_window_mean"
    }
    assert set(windows) <= set(list(AGENTS)[:2]) and all(0 <= v <= 1 for v in windows.values())

    async with httpx.AsyncClient(timeout=30) as client:  # the page, served by the worker too
        served = (await client.get(f"{url}/status.json")).json()
    assert [m["host"] for m in served["members"]] == ["127.0.0.1"]
    assert served["dead_letters"] == {"assemble": 1}

    env = {k: v for k, v in worker.env.items()}
    rc, out, err = await _cli(env, "status", "--json", "--gap", "1")
    assert rc == 0, err
    status = json.loads(out)
    assert len(status["members"]) == 1
    assigned = status["members"][0]["partitions"]
    assert assigned[f"{prefix}.agent-events"] == [0, 1, 2, 3]
    assert assigned[f"{prefix}.ledger"] == [0]
    assert status["open_calls"] == 0
    assert status["dead_letters"] == {"assemble": 1} and status["dead_letters_total"] == 1
    assert sum(c["feedback_count"] for c in status["commits"]) == 8
    assert any("dead letters" in h["what"] for h in status["hints"])
    assert not any(h["level"] == "error" for h in status["hints"])

    worker.stop()  # graceful: the group is left empty
    rc, out, err = await _cli(env, "status", "--gap", "0")
    assert rc == 1, out + err
    assert "no workers in consumer group" in out


async def test_a_partition_that_makes_no_progress_fails_health_then_stops_the_worker(
    kafka_bootstrap, prefix, standin, workers
):
    """faust-streaming#629's shape: a partition assigned whose records never reach the stage
    (a test hook drops what the consumer fetches of it). Its neighbour moves; it stands still
    with a record waiting, and /healthz says so once observe.consumption_stall_s has passed;
    observe.exit_after_stall_s later the worker stops itself, exit status 75, for whatever runs
    it to start it again."""
    port = free_port()
    topic = f"{prefix}.agent-events"
    worker = workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_OBSERVE__HOST="127.0.0.1",
        TRAJSTREAM_OBSERVE__PORT=port,
        TRAJSTREAM_OBSERVE__LAG_INTERVAL_S=1,
        TRAJSTREAM_OBSERVE__CONSUMPTION_STALL_S=4,
        TRAJSTREAM_OBSERVE__EXIT_AFTER_STALL_S=10,
        TESTONLY_TRAJSTREAM_DROP_FETCHED=f"{topic}:0",
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=5) as client:
        await _until(client, f"{url}/readyz", 200, 503)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:  # one undecodable record on each: a dead letter where the stage reads it
            for partition in (0, 1):
                await producer.send_and_wait(topic, b"not avro", key=b"junk", partition=partition)
        finally:
            await producer.stop()

        health = await _until(client, f"{url}/healthz", 503, 200)  # stalled, alive before
        reason = health.json()["reason"]
        assert f"{topic}[0]: 1 records waiting at offset 0, not moved for" in reason, reason
        assert f"{topic}[1]" not in reason  # it moved: its record was read (a dead letter)
        samples = await _scrape(url)
        assert _sum(samples, "trajstream_dead_letters_total", stage="assemble") == 1
        stalled = {
            dict(ls)["partition"]: v
            for (n, ls), v in samples.items()
            if n == "trajstream_consumption_stalled_seconds"
        }
        assert set(stalled) == {"0"} and stalled["0"] >= 4
    await wait_for(
        lambda: "input partitions make no progress" in worker.log.read_text(errors="replace"),
        30,
        "the warning in the worker's log",
    )
    assert worker.proc is not None
    status = await asyncio.to_thread(worker.proc.wait, 60)
    assert status == 75, worker.log.read_text(errors="replace")[-3000:]
    log_text = worker.log.read_text(errors="replace")
    assert "stalled for observe.exit_after_stall_s: input partitions make no progress" in log_text


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: install Debian's chromium (./dev test does when run as root)",
)
async def test_status_page_in_chromium(kafka_bootstrap, prefix, standin, workers, tmp_path):
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=2,
        TRAJSTREAM_WINDOWS__SIZE_S=1,
        TRAJSTREAM_WINDOWS__GRACE_S=0,
        TRAJSTREAM_REWARD__FUNCTION="composite",
        TRAJSTREAM_REWARD__WEIGHTS='{"streams.rewards:success": 0.7, '
        '"streams.rewards:latency_efficiency": 0.3}',
    )
    sims = await _traffic(kafka_bootstrap, prefix, standin, calls=8, pause=0.3)
    msg_ids = {m for s in sims for m in s.msg_ids}
    await wait_for(lambda: set(standin.state.trained) >= msg_ids, 90, "every call committed")
    before = await read_topic(
        kafka_bootstrap, f"{prefix}.windows", until=lambda rs: sum(r.count for r in rs) >= 8
    )
    assert len({w.window_start for w in before}) >= 2, "the run spans several windows"

    settings = Settings(
        app_id=prefix, kafka={"bootstrap_servers": kafka_bootstrap, "topic_prefix": prefix}
    )
    runner = web.AppRunner(application(settings, kafka_bootstrap))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        index = await _chromium("--dump-dom", f"http://127.0.0.1:{port}/")
        after = await read_topic(kafka_bootstrap, f"{prefix}.windows")
        shown = {
            (_attr(c, "data-agent"), _attr(c, "data-window-start"))
            for c in re.findall(r"<circle[^>]*>", index)
        }

        def keys(ws: list) -> set:
            return {(w.agent_name, w.window_start.isoformat()) for w in ws}

        assert all(isinstance(w, WindowSummary) for w in after)
        assert keys(before) <= shown <= keys(after), "the plot shows this run's windows"
        for sim in sims:
            assert sim.call_id in index
        assert 'id="commits"' in index

        # one call's page, by the link on the index: its steps, reward and components
        sim = next(s for s in sims if s.status.value == "OK")
        link = re.search(rf'href="(/calls/{sim.call_id}[^"]*)"', index)
        assert link, "the index links the call"
        page = await _chromium(
            "--dump-dom", f"http://127.0.0.1:{port}{link.group(1).replace('&amp;', '&')}"
        )
        steps = re.findall(r'<tr class="step" data-seq="(\d+)"', page)
        assert steps == ["0", "1", "2"], page[-3000:]
        for msg_id in sim.msg_ids:
            assert msg_id in page
        assert 'id="reward"' in page and 'id="components"' in page
        assert "<td>latency_efficiency</td>" in page and "<td>success</td>" in page

        shot = tmp_path / "status-page.png"
        await _chromium(
            f"--screenshot={shot}", "--window-size=1100,900", f"http://127.0.0.1:{port}/"
        )
        assert shot.stat().st_size > 10_000
        if SCREENSHOT:
            shutil.copyfile(shot, SCREENSHOT)
    finally:
        await runner.cleanup()

    commits = await read_topic(kafka_bootstrap, f"{prefix}.commits")
    assert sum(c.feedback_count for c in commits if isinstance(c, CommitRecord)) == 8
    letters = await read_topic(kafka_bootstrap, f"{prefix}.dead-letters")
    assert not [d for d in letters if isinstance(d, DeadLetter)]


def _attr(tag: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', tag)
    assert found, f"{name} missing in {tag}"
    return found.group(1)


async def _chromium(*args: str) -> str:
    assert CHROMIUM is not None
    profile = tempfile.mkdtemp(prefix="trajstream-chromium-")
    try:
        proc = await asyncio.create_subprocess_exec(
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # tests run as root on CI
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0, err.decode()[-2000:]
    return out.decode()
