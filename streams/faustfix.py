"""A workaround for a faust-streaming recovery race that skips records (0.15.3).

When a worker (re)joins its group, Faust's ``Recovery.on_recovery_completed`` marks the stream
partitions active *before* it seeks them to their committed offsets. In between, the fetcher
can hand the agents records from the position the consumer had before the rebalance, and
Faust's gap handling then counts the records in between as done, so the committed offset moves
past records no agent saw (faust-streaming issues #216 and #221, PR #217 fixed the same order in
another code path). Seen here as events of open calls silently missing after a graceful
restart (tests/integration/test_recovery.py).

:func:`seek_before_resume` makes the partitions active only once the seek completed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from faust.tables.recovery import Recovery

__all__ = ["seek_before_resume"]

_PATCHED = "_trajstream_seek_before_resume"


def seek_before_resume() -> None:
    """Patch Recovery.on_recovery_completed (idempotent)."""
    if getattr(Recovery, _PATCHED, False):
        return
    original = Recovery.on_recovery_completed

    async def on_recovery_completed(self: Recovery, generation_id: int = 0) -> None:
        consumer: Any = self.app.consumer
        deferred: list[set[Any]] = []
        resume = consumer.resume_partitions
        seek = consumer.perform_seek

        def defer(tps: Iterable[Any]) -> None:
            deferred.append(set(tps))

        async def seek_then_resume() -> None:
            await seek()
            while deferred:
                resume(deferred.pop(0))

        consumer.resume_partitions = defer
        consumer.perform_seek = seek_then_resume
        try:
            await original(self, generation_id)
        finally:
            del consumer.resume_partitions, consumer.perform_seek
            while deferred:  # no seek happened (nothing assigned): resume as Faust would
                resume(deferred.pop(0))

    Recovery.on_recovery_completed = on_recovery_completed  # type: ignore[method-assign]
    setattr(Recovery, _PATCHED, True)
