"""What the worker's watches sample from Faust's consumer and tables: how far the tables'
recovery has read, the lag per assigned partition, and the progress of the input partitions
(:mod:`streams.observe.progress`).

May import: :mod:`streams.observe`, faust.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

from ...observe.metrics import Metrics, lag_of

__all__ = ["consumer_lag", "recovery_position", "sample_progress"]

log = logging.getLogger("trajstream")


def recovery_position(app: faust.App) -> int:
    """How far the tables' recovery has read: the sum of its changelog offsets, active and
    standby (it changes whenever the recovery reads a record)."""
    recovery = app.tables.recovery
    offsets = (*recovery.active_offsets.values(), *recovery.standby_offsets.values())
    return sum(max(0, offset) for offset in offsets)


async def sample_progress(consumer: Any, metrics: Metrics, topic: str) -> None:
    """One sample of the assigned partitions of ``topic`` for the progress watch
    (:mod:`streams.observe.progress`): their end offsets, asked of the broker (the fetcher's
    own highwater is not known for a partition it never fetched), and the group's committed
    offsets; a stalled one is logged each time. While the tables recover, or when the broker
    cannot say, nothing is judged (the watch starts afresh)."""
    if not metrics.recovered:
        metrics.consumption({})  # nothing watched: judged afresh from the next sample
        return
    try:
        tps = [tp for tp in consumer.assignment() if tp.topic == topic]
        ends = await asyncio.wait_for(consumer.highwaters(*tps), 10.0) if tps else {}
    except Exception:  # mid-rebalance, or the broker unreachable: counts as moving
        metrics.consumption({})  # nothing watched: judged afresh from the next sample
        return
    committed = getattr(consumer, "_committed_offset", {})
    metrics.consumption({(tp.topic, tp.partition): (ends.get(tp), committed.get(tp)) for tp in tps})
    stuck = metrics.consumption_stalled()
    if stuck:
        log.warning(
            "input partitions make no progress: %s (observe.consumption_stall_s); /healthz "
            "answers 503 until they move, so that a liveness probe restarts this worker",
            stuck,
        )


def consumer_lag(consumer: Any) -> dict[tuple[str, int], int]:
    """Lag per assigned partition: the highwater the fetcher last saw minus the offset the
    group last committed (Faust's own record of it, read from Kafka at every assignment)."""
    try:
        assignment = consumer.assignment()
    except Exception:  # not started yet, or between assignments
        return {}
    committed = getattr(consumer, "_committed_offset", {})
    return lag_of(assignment, consumer.highwater, committed.get)
