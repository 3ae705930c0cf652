"""The offset rules the consumer patches rely on, pure: no Faust, no Kafka.

- :func:`fetched_gaps`: which offsets a fetch shows do not exist in the log;
- :func:`committable`: how far a partition may be committed: the contiguous run of offsets
  handled (or known not to exist) that starts exactly at its committed offset;
- :func:`dropped_fetched` and :func:`reread_from`: what of a fetch Faust threw away during a
  table recovery has to be read again, and from where.

Why each rule is what it is: :mod:`.consumer`, which applies them to Faust's consumer.

May import: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

__all__ = ["committable", "dropped_fetched", "fetched_gaps", "reread_from"]


def fetched_gaps(previous: int | None, offsets: Sequence[int]) -> list[tuple[int, int]]:
    """Offsets (inclusive ranges) that a fetch shows do not exist in the log.

    ``previous`` is the offset of the record fetched just before ``offsets`` for the same
    partition in the same fetch epoch, or ``None`` if unknown (after a seek or a rebalance).

    >>> fetched_gaps(4, [7, 8, 10])
    [(5, 6), (9, 9)]
    >>> fetched_gaps(None, [7, 8])
    []
    """
    gaps: list[tuple[int, int]] = []
    if not offsets:
        return gaps
    if previous is not None and offsets[0] > previous + 1:
        gaps.append((previous + 1, offsets[0] - 1))
    for a, b in pairwise(offsets):
        if b > a + 1:
            gaps.append((a + 1, b - 1))
    return gaps


def committable(committed: int | None, done: Iterable[int]) -> int | None:
    """The offset to commit: the end of the contiguous run of ``done`` offsets from ``committed``.

    ``done`` holds acknowledged offsets and offsets known not to exist. ``None``: nothing to
    commit (no run starts at ``committed``). With ``committed`` unknown (``None``: the seek that
    ends a rebalance has not set it yet), nothing is committed: Faust starts the run at the
    lowest offset done, which passes any record dropped below it.

    >>> committable(15, [16, 17])  # 15 was never handled: the hole holds the commit
    >>> committable(15, [15, 16, 18])
    17
    >>> committable(0, [1])
    >>> committable(None, [13, 14, 15])  # where the run starts is not known yet
    """
    if committed is None:
        return None
    nxt = committed
    for o in sorted(o for o in set(done) if o >= committed):
        if o != nxt:
            break
        nxt += 1
    return nxt if nxt > committed else None


def reread_from(seen: int | None, last_dropped: int) -> int | None:
    """Where a recovering changelog partition must be read again after a fetch of it up to
    ``last_dropped`` was thrown away; ``seen`` is the last offset the recovery read (``-1``:
    none yet; ``None``: its start offsets are not built yet, and its own seek comes next).

    >>> reread_from(52, 79)   # the recovery needs 53..79 again
    53
    >>> reread_from(-1, 24)   # read nothing yet: from the start
    0
    >>> reread_from(80, 79)   # what went was read already
    >>> reread_from(None, 9)  # the recovery's seek follows
    """
    if seen is None or seen >= last_dropped:
        return None
    return 0 if seen < 0 else seen + 1


def dropped_fetched(
    fetched: Mapping[Any, Sequence[int]], delivered: Mapping[Any, set[int]]
) -> dict[Any, int]:
    """The partitions of a fetch whose records were not all delivered, with the last offset
    fetched of each (what has to be read again, at most).

    >>> dropped_fetched({"a": [4, 5, 6], "b": [1, 2]}, {"a": {4, 5, 6}, "b": {1}})
    {'b': 2}
    """
    return {
        tp: offsets[-1]
        for tp, offsets in fetched.items()
        if offsets and not set(offsets) <= delivered.get(tp, set())
    }
