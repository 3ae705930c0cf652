"""The one thing the two runners do differently: where "now" comes from.

Every stage of the core takes ``now`` as an argument and never reads a clock itself. The
runners supply it:

- **live** (:mod:`streams.runtime.live`): processing time. ``now`` of a record is the wall
  clock when the worker handles it (:func:`wall_clock`); time-driven decisions (abandoning a
  call, ending a feedback grace period, forgetting a closed call, committing) are taken on clock
  ticks that the leader publishes to ``<p>.ticks`` and ``<p>.ledger``, so that the agent that
  owns a partition's state acts on it.
- **replay** (:mod:`streams.runtime.replay`): record time. ``now`` of a partition is the latest
  record timestamp seen in it (:class:`RecordClock`), and every record is also a tick for its
  partition. So a replay decides like the workers did as long as they kept up with the traffic.

May import: the standard library and :mod:`streams.models`.
"""

from __future__ import annotations

from datetime import datetime

from ..models import utcnow

__all__ = ["RecordClock", "wall_clock"]


def wall_clock() -> datetime:
    """Processing time, for the live worker."""
    return utcnow()


class RecordClock:
    """Record time per partition, for replay: never moves backwards."""

    def __init__(self) -> None:
        self.at: dict[int, datetime] = {}

    def advance(self, partition: int, at: datetime) -> datetime:
        """Move the partition's clock to ``at`` if later; returns the partition's now."""
        now = self.at.get(partition)
        if now is None or at > now:
            self.at[partition] = now = at
        return now
