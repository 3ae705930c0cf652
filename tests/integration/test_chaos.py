"""Rejoin chaos and a broker restart during traffic, checked at the topics (issue 14).

Bounded: a few rounds of SIGTERM, SIGKILL, scale-up and scale-down of real worker processes
with CPU load added, a couple of minutes in all; the long version is ``bench/chaos.py``. The
check (tests/integration/chaos.py): every produced event is in exactly one trajectory or on
late-events/dead-letters, and every START's prompt reached its trajectory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from streams.broker import LocalBroker
from streams.standin import StandIn

from .chaos import (
    Liveness,
    RecordingProducer,
    Traffic,
    check,
    run_rounds,
    settle,
    where_missing,
    worker_env,
)
from .conftest import CACHE_DIR, Workers, base_env

# one at a time (pytest-xdist, --dist loadgroup): each loads the machine on purpose
pytestmark = [
    pytest.mark.integration,
    pytest.mark.long,
    pytest.mark.xdist_group("chaos"),
]


@pytest.mark.timeout(360)
async def test_rejoin_chaos_loses_nothing(
    kafka_bootstrap: str, prefix: str, standin: StandIn, workers: Any
) -> None:
    # the workers as deployed: a liveness probe on /healthz restarts a stalled one
    env = worker_env(standin.url)
    async with Liveness().probing() as probe:
        async with RecordingProducer(kafka_bootstrap, topic_prefix=prefix) as producer:
            traffic = Traffic(producer)
            task = asyncio.create_task(traffic.run(pause=0.15, seed=14))
            try:
                done = await run_rounds(
                    probe.spawner(lambda **kw: workers(**env, **kw)),
                    rounds=8,
                    seconds=110,
                    round_s=9,
                    traffic=traffic,
                    load=1,
                )
            finally:
                traffic.stop.set()
                await task
        assert set(done) == {"sigterm", "sigkill", "scale-up", "scale-down"}, done
        # up to 150 s for the last calls to close: on a loaded CI machine the last rebalance and
        # the check's reads take longer than here; each check that still finds problems is logged
        verdict = await settle(lambda: check(kafka_bootstrap, prefix, producer.sent), timeout=150)
    print(f"chaos: {dict(done)}; {verdict}; liveness restarts: {probe.restarts or 'none'}")
    if verdict.problems:
        print(await where_missing(kafka_bootstrap, prefix, prefix, verdict.problems))
    assert verdict.calls >= 50
    assert not verdict.problems, "\n".join(verdict.problems[:20])


@pytest.mark.timeout(300)
async def test_broker_restart_during_traffic_loses_nothing(
    prefix: str, standin: StandIn, tmp_path: Path
) -> None:
    broker = LocalBroker(CACHE_DIR, data_dir=tmp_path / "kafka")
    bootstrap = broker.start(timeout=120)
    base = base_env(bootstrap, prefix, tmp_path)
    pool = Workers({**base, **{k: str(v) for k, v in worker_env(standin.url).items()}}, tmp_path)
    try:
        pool.spawn()
        async with RecordingProducer(bootstrap, topic_prefix=prefix) as producer:
            traffic = Traffic(producer)
            task = asyncio.create_task(traffic.run(pause=0.15, seed=15))
            try:
                await asyncio.sleep(20)
                before = traffic.calls
                assert await asyncio.to_thread(broker.restart, 120) == bootstrap
                await asyncio.sleep(25)
                assert traffic.calls > before, "no traffic got through after the restart"
            finally:
                traffic.stop.set()
                await task
        verdict = await settle(lambda: check(bootstrap, prefix, producer.sent), timeout=120)
        print(f"broker restart: {verdict}; {traffic.failed} call(s) cut by the restart")
        assert not verdict.problems, "\n".join(verdict.problems[:20])
        assert pool.started[0].alive
    except BaseException:
        print(pool.logs())
        raise
    finally:
        for w in pool.started:
            w.kill()
        broker.stop()
