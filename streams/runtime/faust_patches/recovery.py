"""Faust's table recovery (faust-streaming 0.15.3, ``tables/recovery.py``): the order of the
steps that hand the stream partitions back to the agents once the tables are restored.

May import: faust, mode, the standard library.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["install_clear_queues_first"]


def install_clear_queues_first() -> None:
    """``Recovery.on_recovery_completed``: the agents' queues are cleared *before* the stream
    partitions are resumed, never after, so no queue is cleared under records already read.
    Nothing of a stream partition can be in a queue then (revocation cleared them,
    ``app/base.py`` ~1823, and the partitions stayed paused). The seek still comes *after* the
    resume, as upstream (faust-streaming/faust#217): seeking first would pause every
    partition, and aiokafka's ``fetched_records`` reads an empty set of partitions as "all"
    (``aiokafka/consumer/fetcher.py`` ~1221), whose records Faust drops (``consumer.py``
    ~758). Records delivered before the seek stay queued and are handled; the seek may deliver
    some of them again (at-least-once; every effect here is idempotent).

    Upstream (~649-659): the stream partitions are resumed while the fetcher and flow control
    already run, so records fill the agents' queues and the read offsets advance; the seek to
    the committed offsets resets them while deliveries go on; then ``flow_control.resume()``
    clears every agent's input queue (``mode/utils/queues.py`` ~97-108; channels are made with
    ``clear_on_resume=True``): records delivered but not yet taken vanish, never acknowledged,
    and the commit passes them (faust-streaming/faust#596, #606; #216/#217 and #221/#223 were
    earlier hand-over fixes whose order this keeps).

    Fails without it: ``tests/unit/runtime/faust_patches/test_recovery.py::
    test_recovery_completion_clears_queues_before_resuming_then_seeks`` and
    ``tests/integration/test_handover.py::
    test_no_committed_offset_passes_a_record_no_agent_handled`` (alone: the records the clear
    drops hold their partitions' commits, and the stall watch stops the worker; with the
    consumer patches left out too, the commits pass them).
    """
    from faust.tables.recovery import Recovery

    Recovery.on_recovery_completed = _on_recovery_completed  # type: ignore[method-assign]


async def _on_recovery_completed(self: Any, generation_id: int = 0) -> None:
    """Faust 0.15.3's ``Recovery.on_recovery_completed``; the queues are cleared first."""
    consumer = self.app.consumer
    self.log.info("Restore complete!")
    await self.app.on_rebalance_complete.send()
    self._set_recovery_ended()
    callback_coros = [
        asyncio.ensure_future(
            table.on_recovery_completed(
                self.actives_for_table[table],
                self.standbys_for_table[table],
            )
        )
        for table in self.tables.values()
    ]
    if callback_coros:
        await asyncio.wait(callback_coros)
    assignment = consumer.assignment()
    if self.app.consumer_generation_id != generation_id:
        self.log.warning(
            f"Recovery rebalancing again app id "
            f"{self.app.consumer_generation_id} param {generation_id}"
        )
        return
    # The change: clear the agents' queues (flow control is already active) before any record
    # of a stream partition can be delivered, instead of after the seek below.
    self.app.flow_control.resume()
    consumer.resume_partitions({tp for tp in assignment if not self._is_changelog_tp(tp)})
    if assignment:
        self.log.info("Seek stream partitions to committed offsets.")
        await self._wait(consumer.perform_seek(), timeout=self.app.conf.broker_request_timeout)
    self.completed.set()
    self.log.dev("Resume stream partitions")
    consumer.resume_flow()
    await self.app._fetcher.maybe_start()
    self.tables.on_actives_ready()
    if not self.app.assignor.assigned_standbys():
        self.tables.on_standbys_ready()
    self.app.on_rebalance_end()
    self.log.info("Worker ready")
