"""Input partitions that have records waiting and make no progress: a consumer stuck after a
rebalance.

A worker can be assigned a partition and never read it again: faust-streaming#629 and #166
report partitions assigned after a rebalance for which the consumer never sends a fetch
request, until the process restarts. Nothing fails, nothing is logged, and the records of that
partition wait. :class:`ProgressWatch` notices it from outside the consumer: the live runner
samples, every ``observe.lag_interval_s``, the end offset (asked of the broker) and the
group's committed offset of each watched partition; a partition whose end is past its
committed offset and whose committed offset has not moved for ``observe.consumption_stall_s``
is stalled. The worker then logs it and answers 503 on ``/healthz`` (:mod:`.web`), so that a
liveness probe restarts it and the group hands the partition out again.

Which partitions are watched is the runner's choice: only those whose stage waits on no other
service (the assemble stage's ``<p>.agent-events``), since a stage that retries Trinity
during an outage also stops moving, for a reason a restart does not cure.

May import: the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

__all__ = ["ProgressWatch"]

Partition = tuple[str, int]


class ProgressWatch:
    """Per partition: since when records have waited without the committed offset moving.

    ``clock`` gives the time in seconds (the worker's metrics pass the wall clock; a seam for
    tests)."""

    def __init__(self, stall_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s = stall_s
        self._clock = clock
        self._since: dict[Partition, tuple[int, float]] = {}  # (committed, when it was seen)
        self._end: dict[Partition, int] = {}

    def reset(self) -> None:
        """Forget every partition (a rebalance began, or the tables recover: the next
        assignment is judged afresh)."""
        self._since.clear()
        self._end.clear()

    def sample(self, offsets: Mapping[Partition, tuple[int | None, int | None]]) -> None:
        """Take one sample: ``(end offset, committed offset)`` per watched partition. An end
        of None is not known (the partition counts as moving); a committed offset of None was
        never committed (counted from 0). A partition left out is no longer watched."""
        now = self._clock()
        since: dict[Partition, tuple[int, float]] = {}
        ends: dict[Partition, int] = {}
        for partition, (end, committed) in offsets.items():
            done = committed or 0
            if end is None or end <= done:
                continue  # nothing waits: whatever its offset, it is not stuck
            before = self._since.get(partition)
            since[partition] = before if before is not None and before[0] == done else (done, now)
            ends[partition] = end
        self._since, self._end = since, ends

    def stuck(self) -> dict[Partition, float]:
        """Seconds each partition with records waiting has not moved, until now (partitions
        that moved at the last sample or had nothing waiting are left out)."""
        now = self._clock()
        return {p: max(0.0, now - at) for p, (_, at) in self._since.items()}

    def stalled(self) -> dict[Partition, float]:
        """The partitions stuck for ``stall_s`` or more, with how long."""
        return {p: s for p, s in self.stuck().items() if s >= self.stall_s}

    def describe(self) -> str:
        """The stalled partitions in words, for a log line or a health answer ("" if none)."""
        parts = []
        for (topic, partition), seconds in sorted(self.stalled().items()):
            done = self._since[(topic, partition)][0]
            waiting = self._end[(topic, partition)] - done
            parts.append(
                f"{topic}[{partition}]: {waiting} records waiting at offset {done}, "
                f"not moved for {seconds:.0f} s"
            )
        return "; ".join(parts)
