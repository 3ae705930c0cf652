"""Replay's own cost: the replay runner over in-memory records, no broker, no HTTP.

    .venv/bin/python bench/replay.py                 # 2,000 calls of 5 events, best of 3
    .venv/bin/python bench/replay.py --calls 500 --runs 1

It builds realistic calls (the same events as bench/run.py: start, two LLM steps, a tool step,
end; 1-4 KB each), feeds them to :class:`streams.runtime.replay.ReplayRunner` with every call
selected and the ``success`` reward, and reports records per CPU second (process time, best
run). This is the part of ``trajstream replay`` that is the pipeline's core: reading the topics
and sending to Trinity come on top.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import call_events  # noqa: E402
from streams.core.rewards import build_rewarder  # noqa: E402
from streams.core.select import build_strategy  # noqa: E402
from streams.models import utcnow  # noqa: E402
from streams.runtime.replay import ReplayRunner, SourceRecord  # noqa: E402


def records(calls: int, seed: int) -> list[SourceRecord]:
    rng = random.Random(seed)
    t0 = utcnow()
    out: list[SourceRecord] = []
    for _ in range(calls):
        for key, value in call_events(rng):
            offset = len(out)
            out.append(
                SourceRecord("event", 0, offset, t0 + timedelta(milliseconds=offset), key, value)
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    recs = records(args.calls, args.seed)
    best = float("inf")
    for _ in range(args.runs):
        runner = ReplayRunner(
            build_strategy("sampling:1"), [build_rewarder("streams.rewards:success")]
        )
        began = time.process_time()
        runner.feed_all(recs)
        runner.finish()
        best = min(best, time.process_time() - began)
        if runner.stats["trajectories"] != args.calls:
            raise SystemExit(f"expected {args.calls} trajectories, got {dict(runner.stats)}")
    print(
        f"replay: {len(recs):,} records ({args.calls:,} calls), best of {args.runs}: "
        f"{best:.2f} s CPU, {len(recs) / best:,.0f} records/s"
    )


if __name__ == "__main__":
    main()
