"""A worker whose broker or Trinity is gone: bounded logs, little CPU, and a stop that ends.

Before the fixes (issue 14), with the local broker stopped under a worker, aiokafka asked for
metadata again the moment a request failed: about 150,000 log lines in 30 s at ~90 % CPU, and
SIGTERM did not stop the worker in 40 s. With Trinity unreachable a SIGTERM did not stop it in
60 s either.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from streams.broker import LocalBroker, free_port
from streams.sdk import TrajstreamProducer
from streams.standin import StandIn

from .conftest import CACHE_DIR, Workers, base_env, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.long]

STOP_TIMEOUT_S = 5


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


async def _sigterm_and_wait(proc, limit: float) -> float:
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(proc.wait, limit)
    return time.monotonic() - started


@pytest.mark.timeout(240)
async def test_a_stopped_broker_costs_a_few_lines_and_sigterm_still_stops(
    prefix: str, standin: StandIn, tmp_path: Path
) -> None:
    broker = LocalBroker(CACHE_DIR, data_dir=tmp_path / "kafka")
    bootstrap = broker.start(timeout=120)
    env = base_env(bootstrap, prefix, tmp_path)
    env.update(TRAJSTREAM_TRINITY__URL=standin.url, TRAJSTREAM_STOP_TIMEOUT_S=str(STOP_TIMEOUT_S))
    pool = Workers(env, tmp_path)
    try:
        worker = pool.spawn()
        await wait_for(
            lambda: b"Worker]: Ready" in worker.log.read_bytes(), 90, "the worker to be ready"
        )
        broker.stop()
        before, cpu_before = _lines(worker.log), _cpu_seconds(worker.proc.pid)
        await asyncio.sleep(20)
        lines, cpu = _lines(worker.log) - before, _cpu_seconds(worker.proc.pid) - cpu_before
        print(f"broker down 20 s: {lines} log lines, {cpu:.2f} CPU seconds")
        assert worker.alive
        assert lines < 200, f"{lines} log lines in 20 s with the broker down"
        waited = await _sigterm_and_wait(worker.proc, STOP_TIMEOUT_S + 20)
        assert worker.proc.poll() is not None, f"still running {waited:.0f}s after SIGTERM"
        assert b"graceful stop did not finish" in worker.log.read_bytes()
    except BaseException:
        print(pool.logs())
        raise
    finally:
        for w in pool.started:
            w.kill()
        broker.stop()


@pytest.mark.timeout(180)
async def test_an_unreachable_trinity_does_not_hold_a_stop(
    kafka_bootstrap: str, prefix: str, workers
) -> None:
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    worker = workers(
        TRAJSTREAM_TRINITY__URL=gone,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_STOP_TIMEOUT_S=str(STOP_TIMEOUT_S),
    )
    async with TrajstreamProducer(kafka_bootstrap, topic_prefix=prefix) as ts:
        async with ts.call(agent_name="a") as call:
            await call.completion(response_id="chatcmpl-1", response_model="m")
    await wait_for(
        lambda: b"retrying" in worker.log.read_bytes(), 90, "feedback retries against no Trinity"
    )
    waited = await _sigterm_and_wait(worker.proc, STOP_TIMEOUT_S + 20)
    assert worker.proc.poll() is not None, f"still running {waited:.0f}s after SIGTERM"
    assert waited < STOP_TIMEOUT_S + 10
