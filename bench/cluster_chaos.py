"""The long three-broker chaos run: the scenario of tests/integration/test_cluster_chaos.py,
longer.

    .venv/bin/python bench/cluster_chaos.py --rounds 20 --minutes 30 [--workers 2]

A local cluster of three KRaft nodes (replication factor 3, min.insync.replicas 2), a
``trajstream gateway`` process, ``--workers`` worker processes and the Trinity stand-in;
traffic through the gateway while, round after round, the leader of the agent-events partition
0 or the active controller (in turn) is killed with SIGKILL and started again. Stops after
``--rounds`` rounds or ``--minutes`` minutes, whichever comes first, then checks that every
answered request and accepted end is on the topic, every event is in exactly one trajectory or
recorded, and no feedback was doubled beyond Trinity's once-per-msg_id rule. Exit code 0:
nothing lost. Logs stay in the printed directory.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streams.devtools.broker import LocalCluster
from streams.devtools.standin import StandIn
from tests.integration.chaos import Liveness
from tests.integration.cluster_chaos import (
    GatewayProcess,
    GatewayTraffic,
    cluster_env,
    kill_rounds,
    settle,
    verify,
)
from tests.integration.conftest import CACHE_DIR, Workers


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="trajstream-cluster-chaos-"))
    prefix = f"cchaos{uuid.uuid4().hex[:8]}"
    cluster = LocalCluster(CACHE_DIR, brokers=3, data_dir=tmp / "cluster")
    standin = StandIn()
    await standin.start("127.0.0.1", 0)
    gateway: GatewayProcess | None = None
    pool: Workers | None = None
    probe = Liveness()  # as deployed: a liveness probe restarts a stalled worker
    started = time.monotonic()
    try:
        bootstrap = await asyncio.to_thread(cluster.start, 180)
        env = cluster_env(bootstrap, prefix, tmp, standin.url)
        gateway = GatewayProcess(
            {
                **env,
                "TRAJSTREAM_GATEWAY__PRODUCTION_URL": f"{standin.url}/v1",
                "TRAJSTREAM_GATEWAY__SPILL_DIR": str(tmp / "spill"),
            },
            tmp / "gateway.log",
        ).start()
        pool = Workers(env, tmp)
        spawn = probe.spawner(pool.spawn)
        async with probe.probing():
            for _ in range(args.workers):
                spawn()
            await gateway.ready()
            traffic = GatewayTraffic(gateway.url)
            task = asyncio.create_task(traffic.run(pause=args.pause))
            deadline = time.monotonic() + args.minutes * 60
            killed = []
            try:
                await asyncio.sleep(15)
                for i in range(args.rounds):
                    if time.monotonic() > deadline:
                        break
                    target = "leader" if i % 2 == 0 else "controller"
                    killed += await kill_rounds(
                        cluster,
                        f"{prefix}.agent-events",
                        traffic,
                        rounds=[target],
                        down_s=args.down_s,
                        after_s=args.after_s,
                        first=i + 1,
                    )
            finally:
                traffic.stop.set()
                await task
            verdict = await settle(lambda: verify(bootstrap, prefix, traffic, standin), timeout=240)
            minutes = (time.monotonic() - started) / 60
            print(f"{len(killed)} rounds {killed} in {minutes:.1f} min; {verdict}")
            print(f"liveness restarts: {probe.restarts or 'none'}")
            for problem in verdict.problems[:50]:
                print("  " + problem)
            print(f"logs: {tmp}")
            return 1 if verdict.problems else 0
    finally:
        if gateway is not None:
            gateway.stop()
        if pool is not None:
            for w in pool.started:
                w.kill()
        await standin.stop()
        await asyncio.to_thread(cluster.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--down-s", type=float, default=15.0, help="seconds a node stays down")
    parser.add_argument("--after-s", type=float, default=10.0, help="seconds between rounds")
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between calls")
    sys.exit(asyncio.run(main(parser.parse_args())))
