"""A three-broker cluster loses a broker mid-traffic, twice, and nothing is lost (issue 24).

The scenario and its check are in tests/integration/cluster_chaos.py: traffic through a real
``trajstream gateway`` process and two real worker processes, replication factor 3 with
``min.insync.replicas`` 2, every producer with ``acks=all`` and idempotence; one round
SIGKILLs the leader of the agent-events partition 0, the other the active controller of the
KRaft quorum, each restarted on its data. Bounded: about two minutes. The long version is
``bench/cluster_chaos.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streams.devtools.broker import LocalCluster
from streams.devtools.standin import StandIn

from .chaos import Liveness
from .cluster_chaos import (
    GatewayProcess,
    GatewayTraffic,
    cluster_env,
    kill_rounds,
    settle,
    verify,
)
from .conftest import CACHE_DIR, Workers

# one at a time (pytest-xdist, --dist loadgroup): each loads the machine on purpose
pytestmark = [
    pytest.mark.integration,
    pytest.mark.long,
    pytest.mark.xdist_group("chaos"),
]


@pytest.mark.timeout(420)
async def test_a_killed_broker_and_a_killed_controller_lose_nothing(
    prefix: str, standin: StandIn, tmp_path: Path
) -> None:
    cluster = LocalCluster(CACHE_DIR, brokers=3, data_dir=tmp_path / "cluster")
    gateway: GatewayProcess | None = None
    pool: Workers | None = None
    probe = Liveness()  # as deployed: a liveness probe restarts a stalled worker
    try:
        bootstrap = await asyncio.to_thread(cluster.start, 180)
        env = cluster_env(bootstrap, prefix, tmp_path, standin.url)
        gateway = GatewayProcess(
            {
                **env,
                "TRAJSTREAM_GATEWAY__PRODUCTION_URL": f"{standin.url}/v1",
                "TRAJSTREAM_GATEWAY__SPILL_DIR": str(tmp_path / "spill"),
            },
            tmp_path / "gateway.log",
        ).start()
        pool = Workers(env, tmp_path)
        spawn = probe.spawner(pool.spawn)
        async with probe.probing():
            spawn()
            spawn()
            await gateway.ready()
            traffic = GatewayTraffic(gateway.url)
            task = asyncio.create_task(traffic.run(pause=0.1))
            try:
                await asyncio.sleep(15)  # the workers join and the first calls go through
                killed = await kill_rounds(
                    cluster,
                    f"{prefix}.agent-events",
                    traffic,
                    rounds=["leader", "controller"],
                    down_s=10,
                    after_s=5,
                )
            finally:
                traffic.stop.set()
                await task
            assert [t for t, _ in killed] == ["leader", "controller"]
            assert len(traffic.answered) >= 60, f"too little traffic: {len(traffic.answered)}"
            verdict = await settle(lambda: verify(bootstrap, prefix, traffic, standin), timeout=120)
            print(
                f"cluster chaos: killed {killed}; {verdict}; {traffic.failed} call(s) failed; "
                f"liveness restarts: {probe.restarts or 'none'}"
            )
            assert not verdict.problems, "\n".join(verdict.problems[:20])
            assert verdict.events.calls >= 30
            dead = [w for w in pool.started if not w.alive]
            assert not dead, "a worker died: " + "; ".join(
                f"{w.log.name} exit {w.proc.returncode if w.proc else None}: "
                + w.log.read_text(errors="replace").strip().splitlines()[-1][:300]
                for w in dead
            )
    except BaseException:
        if pool is not None:
            print(pool.logs())
        if gateway is not None and gateway.log.exists():
            print(f"--- gateway ---\n{gateway.log.read_text(errors='replace')[-6000:]}")
        raise
    finally:
        if gateway is not None:
            gateway.stop()
        if pool is not None:
            for w in pool.started:
                w.kill()
        await asyncio.to_thread(cluster.stop)
