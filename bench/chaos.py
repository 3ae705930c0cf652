"""The long rejoin chaos run (a soak): the scenario of tests/integration/test_chaos.py, longer.

    .venv/bin/python bench/chaos.py --rounds 200 --minutes 30 [--load 2] [--bootstrap HOST:PORT]

Rounds of SIGTERM, SIGKILL, scale-up and scale-down of real worker processes, in turn, during
traffic, with ``--load`` busy-loop processes adding CPU load; stops after ``--rounds`` rounds or
``--minutes`` minutes, whichever comes first, then checks at the topics that every produced
event is in exactly one trajectory or on late-events/dead-letters and that every START's prompt
reached its trajectory. Starts its own local broker (unless ``--bootstrap``) and the Trinity
stand-in, and stops both; worker logs stay in the printed directory. Exit code 0: nothing lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streams.broker import LocalBroker
from streams.standin import StandIn
from tests.integration.chaos import (
    Liveness,
    RecordingProducer,
    Traffic,
    check,
    run_rounds,
    settle,
    worker_env,
)
from tests.integration.conftest import CACHE_DIR, Workers


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="trajstream-chaos-"))
    prefix = f"chaos{uuid.uuid4().hex[:8]}"
    broker = None if args.bootstrap else LocalBroker(CACHE_DIR, data_dir=tmp / "kafka")
    bootstrap = args.bootstrap or broker.start(timeout=120)  # type: ignore[union-attr]
    standin = StandIn()
    await standin.start("127.0.0.1", 0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    env.update(
        TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
        TRAJSTREAM_APP_ID=prefix,
        TRAJSTREAM_DATA_DIR=str(tmp / "data"),
        TRAJSTREAM_LOG_LEVEL="info",
        PYTHONUNBUFFERED="1",
        **{k: str(v) for k, v in worker_env(standin.url).items()},
    )
    pool = Workers(env, tmp)
    probe = Liveness()  # as deployed: a liveness probe restarts a stalled worker
    started = time.monotonic()
    try:
        async with probe.probing(), RecordingProducer(bootstrap, topic_prefix=prefix) as producer:
            traffic = Traffic(producer)
            task = asyncio.create_task(traffic.run(pause=args.pause, seed=args.seed))
            try:
                done = await run_rounds(
                    probe.spawner(pool.spawn),
                    rounds=args.rounds,
                    seconds=args.minutes * 60,
                    round_s=args.round_s,
                    traffic=traffic,
                    load=args.load,
                )
            finally:
                traffic.stop.set()
                await task
        verdict = await settle(lambda: check(bootstrap, prefix, producer.sent), timeout=180)
        minutes = (time.monotonic() - started) / 60
        print(f"{sum(done.values())} rounds {dict(done)} in {minutes:.1f} min; {verdict}")
        print(f"liveness restarts: {probe.restarts or 'none'}")
        for problem in verdict.problems[:50]:
            print("  " + problem)
        print(f"worker logs: {tmp}")
        return 1 if verdict.problems else 0
    finally:
        for w in pool.started:
            w.kill()
        await standin.stop()
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--round-s", type=float, default=10.0, help="seconds between rounds")
    parser.add_argument("--load", type=int, default=1, help="busy-loop processes")
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between calls")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--bootstrap", help="an existing cluster instead of a local broker")
    sys.exit(asyncio.run(main(parser.parse_args())))
