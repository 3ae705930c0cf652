"""Faust's consumer (faust-streaming 0.15.3, ``transport/consumer.py``): which offsets a commit
may pass, and which fetched records reach the agents.

Upstream, a commit can pass records no agent handled (the loss at a hand-over, told whole in
:mod:`streams.runtime.faust_patches`): gaps are learnt from a read offset that a seek resets
(faust-streaming/faust#596), a one-record hole at the committed offset passes (#606, fix PR
#707 not merged), a partition whose committed offset is unknown starts its run at the lowest
offset acknowledged, a record is dropped as "read already" against a read offset that a late
delivery moved, and a changelog fetch thrown away during a table recovery is never read again
(#629). Each ``install_*`` function below replaces one of these; its docstring names the
upstream behaviour and the test that fails without it. Line numbers are of 0.15.3.

What it costs: after a seek, an offset missing at the very head of the first fetch (a
transaction marker or compacted record right at the committed offset) is not learnt as a gap
and holds that partition's commit until the worker restarts; trajstream's input topics are
neither transactional nor compacted. A record fetched before a seek back may be handled twice
(at-least-once; every effect is idempotent), and a partition whose first offset the broker
would not give commits nothing until the next rebalance or restart (the stall watch restarts
such a worker).

May import: faust, mode, the standard library, :mod:`.offsets`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .offsets import committable, dropped_fetched, fetched_gaps, reread_from

__all__ = [
    "FIRST_OFFSET_RETRIES_S",
    "ReadOffsets",
    "install_contiguous_commit",
    "install_gaps_from_fetches",
    "install_no_drop_as_read",
    "install_reread_thrown_changelogs",
    "install_seek_keeps_committed",
]


# -- gaps: learnt from what the fetcher returned, not from the read offset ---------------------


def install_gaps_from_fetches() -> None:
    """Gaps are learnt from the fetcher: an offset counts as a gap only if two records returned
    one after the other for a partition, in one fetch epoch (no seek and no rebalance in
    between or during the fetch), skip it; such offsets do not exist in the log (compaction,
    transaction markers). ``Consumer._add_gap``, fed by the resettable read offset, does
    nothing; ``Consumer._wait_next_records`` learns the gaps; ``Consumer.seek`` starts a new
    epoch.

    Upstream: the next delivery after a seek records a "gap" from the reset read offset to its
    own offset (``consumer.py`` ~1215), and ``_new_offset`` counts gaps as acknowledged
    (~1117): a commit passes every record in between (faust-streaming/faust#596).

    Fails without it: ``tests/unit/runtime/faust_patches/test_consumer.py::
    test_a_gap_from_a_reset_read_offset_passes_nothing``; with the other hand-over patches left
    out too (not alone: the contiguous commit holds such a gap's head),
    ``tests/integration/test_handover.py::test_no_committed_offset_passes_a_record_no_agent_handled``.
    """
    from faust.transport.consumer import Consumer

    Consumer._add_gap = _add_gap  # type: ignore[method-assign]
    Consumer.seek = _seek_wrapper(Consumer.seek)  # type: ignore[method-assign]
    Consumer._wait_next_records = _fetch_wrapper(  # type: ignore[method-assign]
        Consumer._wait_next_records
    )


def _epoch(consumer: Any) -> tuple[int, int]:
    """Changes at every seek and every rebalance: fetches across it are not one sequence."""
    return (getattr(consumer, "_th_seeks", 0), consumer.app.consumer_generation_id)


def _forget_positions(consumer: Any, tps: Iterable[Any] | None = None) -> None:
    consumer._th_seeks = getattr(consumer, "_th_seeks", 0) + 1
    last: dict[Any, int] = consumer.__dict__.setdefault("_th_last", {})
    if tps is None:
        last.clear()
    else:
        for tp in tps:
            last.pop(tp, None)


def _seek_wrapper(original: Any) -> Any:
    async def seek(self: Any, partition: Any, offset: int) -> None:
        _forget_positions(self, [partition])
        await original(self, partition, offset)
        _forget_positions(self, [partition])

    return seek


def _fetch_wrapper(original: Any) -> Any:
    async def _wait_next_records(self: Any, timeout: float) -> Any:
        before = _epoch(self)
        records, active = await original(self, timeout)
        if records and _epoch(self) == before:
            _learn_gaps(self, records)
        elif records:
            # a seek or rebalance happened during the fetch: its records may come from before
            # or after it; learn no gap from them, and nothing about what follows them
            last = self.__dict__.setdefault("_th_last", {})
            for key in records:
                last.pop(key, None)
        return records, active

    return _wait_next_records


def _learn_gaps(
    consumer: Any,
    records: Mapping[Any, Sequence[Any]],
    *,
    trust_previous: bool = True,
    remember: bool = True,
) -> None:
    last: dict[Any, int] = consumer.__dict__.setdefault("_th_last", {})
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    from faust.transport.consumer import ensure_TP

    for key, recs in records.items():
        if not recs:
            continue
        tp = ensure_TP(key)
        offsets = [r.offset for r in recs]
        previous = last.get(tp) if trust_previous else None
        if acks_enabled_for(tp.topic):
            committed = consumer._committed_offset[tp]
            tree = consumer._gap[tp]
            for lo, hi in fetched_gaps(previous, offsets):
                if committed is not None:
                    lo = max(lo, committed)
                if lo <= hi:
                    tree.addi(lo, hi + 1)
            if tree:
                tree.merge_overlaps()
        if remember:
            last[tp] = offsets[-1]
        else:
            last.pop(tp, None)


async def _add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
    """Replaces Faust's: gaps from the resettable read offset are not evidence (see above)."""


# -- the commit: a contiguous run from the committed offset -----------------------------------


def install_contiguous_commit() -> None:
    """``Consumer._new_offset`` commits only a contiguous run of acknowledged (or gap) offsets
    that starts exactly at the committed offset (0 included; :func:`.offsets.committable`); a
    hole at the head holds the commit. A partition whose committed offset is not known yet
    (``None``: between an assignment and the end of the seek that follows it) commits nothing.

    Upstream: a hole of one record right at the committed offset passes
    ``min(acked) - committed > 1`` (~1140, the off-by-one of faust-streaming/faust#606; fix PR
    #707 not merged; an offset of 0 even skips the test, ``if committed``), and with the
    committed offset unknown the run starts at the lowest offset acknowledged: a commit made
    while the seek was on its way passed records a rebalance had dropped (found in a chaos run
    on a loaded machine: the seek took 1.3 s, the table recovery had started the fetcher, and
    the commit timer passed five records).

    Fails without it: ``tests/unit/runtime/faust_patches/test_consumer.py::
    test_a_hole_at_the_committed_offset_holds_the_commit``; with the other hand-over patches
    left out too (not alone: the recovery's order and the seek keep the hole from forming in
    that test), ``tests/integration/test_handover.py::
    test_no_committed_offset_passes_a_record_no_agent_handled``.
    """
    from faust.transport.consumer import Consumer

    Consumer._new_offset = _new_offset  # type: ignore[method-assign]


def _new_offset(self: Any, tp: Any) -> int | None:
    acked = self._acked[tp]
    if not acked:
        return None
    acked_index = self._acked_index[tp]
    gaps = self._gap[tp]
    if gaps:
        top = max(acked) + 1
        for interval in sorted(gaps.overlap(0, top), key=lambda i: i.begin):
            for offset in range(interval.begin, interval.end):
                if offset not in acked_index:
                    acked_index.add(offset)
                    acked.append(offset)
        gaps.chop(0, max(max(acked) + 1, top))
    acked.sort()
    committed = self._committed_offset[tp]
    upto = committable(committed, acked)
    if upto is None:
        if committed is not None:
            # drop what is below the committed offset: handled again after a seek, already in
            stale = [o for o in acked if o < committed]
            if stale:
                del acked[: len(stale)]
                acked_index.difference_update(stale)
        return None
    done = [o for o in acked if o < upto]
    del acked[: len(done)]
    acked_index.difference_update(done)
    return upto


# -- the seek to the committed offsets ----------------------------------------------------------


def install_seek_keeps_committed() -> None:
    """``Consumer.perform_seek`` keeps a committed offset of 0 (upstream stores it as ``None``)
    and never moves the committed offset back: the committed offsets it reads may predate a
    commit made while it waited (upstream then forgets that commit; with the contiguous run,
    the offsets committed since would be a hole that holds every later commit). For a
    partition the group never committed it takes the partition's first offset as the committed
    one (reading starts there: ``auto.offset.reset`` is ``earliest``) and seeks there. It also
    forgets the acknowledgements made before it: every partition is read again from its
    committed offset, and Faust's stream acknowledges an event it skips unhandled while a
    rebalance has the flow stopped (``streams.py`` ~1287/1342). The first offsets are asked for
    again a few times; while not known, the partition commits nothing.

    Upstream: aiokafka's ``seek_to_committed`` leaves a partition without a committed offset
    where its fetcher is, and Faust leaves the committed offset unknown, so the run starts at
    the lowest offset acknowledged: a record at the head of a new partition that a hand-over
    dropped (Faust throws away a fetch that returns while a rebalance stops the flow,
    ``consumer.py`` ~758-766, counting on this seek to read it again) was passed by the first
    commit after it (found in the fault tests: the first record of a ``<p>.rewarded``
    partition, fetched just before a rebalance, never fed back).

    Fails without it: ``tests/unit/runtime/faust_patches/test_consumer.py::
    test_a_partition_never_committed_holds_its_commit_until_its_first_record_is_done`` and
    ``tests/integration/test_handover.py::test_records_dropped_before_the_seek_of_a_never_committed_partition_are_read_again``.
    """
    from faust.transport.consumer import Consumer

    Consumer.perform_seek = _perform_seek  # type: ignore[method-assign]


async def _perform_seek(self: Any) -> None:
    """Faust's ``Consumer.perform_seek``, keeping a committed offset of 0 and the fetch epoch;
    a partition the group never committed starts its run at the partition's first offset.
    Acknowledgements made before it are forgotten: every partition is read again from its
    committed offset, so they are made again, and some were of records a stream skipped."""
    from faust.transport.consumer import ensure_TP

    _forget_acks(self)
    read_offset = self._read_offset
    _forget_positions(self)
    _committed_offsets = await self.seek_to_committed()
    _forget_positions(self)
    read_offset.update(
        {
            tp: offset if offset is not None and offset >= 0 else None
            for tp, offset in _committed_offsets.items()
        }
    )
    committed_offsets = {}
    never: list[Any] = []
    for key, offset in _committed_offsets.items():
        tp = ensure_TP(key)
        known = self._committed_offset[tp]
        if offset is None or offset < 0:
            if self.app.topics.acks_enabled_for(tp.topic):
                if known is None:
                    never.append(tp)
                else:  # committed by this worker since the broker answered: read from there
                    await self.seek(tp, known)
            continue
        # the broker's answer may predate a commit this worker made meanwhile (its fetcher and
        # agents ran before the seek): never move the committed offset back, or the offsets
        # committed since would be a hole at its head and hold every later commit
        committed_offsets[tp] = offset if known is None else max(known, offset)
    first = await _first_offsets(self, never)
    for tp, offset in first.items():
        if self._committed_offset[tp] is not None:
            continue  # set meanwhile (a seek that ran beside this one): never move it back
        # aiokafka's seek_to_committed leaves a partition without a committed offset where its
        # fetcher is: past any record fetched and then dropped (Faust drops what it fetched when
        # a rebalance starts, and seeks back to the committed offsets to read it again). Read
        # such a partition from its first offset, as a new owner would (auto.offset.reset).
        await self.seek(tp, offset)
        committed_offsets[tp] = offset
    self._committed_offset.update(committed_offsets)


def _forget_acks(consumer: Any) -> None:
    """Drop the acknowledgements not committed yet, of every partition: the seek that follows
    reads each again from its committed offset. Some were made for records a stream skipped
    unhandled (Faust's stream acknowledges an event it skips because the flow was stopped or
    its generation is past, ``streams.py`` ~1287/1342, as during a rebalance), and would let a
    commit pass such a record before it is handled again."""
    for tp in list(consumer._acked):
        consumer._acked[tp].clear()
        consumer._acked_index[tp].clear()


FIRST_OFFSET_RETRIES_S: tuple[float, ...] = (0.5, 1.0, 2.0)
"""Waits between the tries to read the first offsets of never-committed partitions."""


async def _first_offsets(consumer: Any, tps: list[Any]) -> dict[Any, int]:
    """The first offset of each of ``tps`` (partitions the group never committed), keyed by
    ``tps`` themselves: where reading starts, so where a commit's run starts (see
    :func:`install_seek_keeps_committed`). Tried again a few times; while it is not known the
    partitions commit nothing (a committed offset unknown holds the commit), until the next
    rebalance or restart."""
    if not tps:
        return {}
    first: Mapping[Any, int | None] = {}
    for wait in (*FIRST_OFFSET_RETRIES_S, None):
        try:
            first = await consumer.earliest_offsets(*tps)
            break
        except Exception as exc:
            if wait is None:
                consumer.log.warning(
                    "first offsets of never-committed partitions %s not read (%r): they commit "
                    "nothing until the next rebalance or restart",
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in tps),
                    exc,
                )
                return {}
            await asyncio.sleep(wait)
    found = {tp: first.get(tp) for tp in tps}
    return {tp: offset for tp, offset in found.items() if offset is not None and offset >= 0}


# -- the read offsets: no input record dropped as read already ----------------------------------


def install_no_drop_as_read() -> None:
    """``Consumer._read_offset`` is a :class:`ReadOffsets`, which never drops a record of an
    input topic as read already.

    Upstream: Faust drops a fetched record whose offset is below its partition's read offset
    (``_drain_messages`` ~1209-1226); a record fetched before a seek and delivered after it set
    the read offset past the records the seek was to read again, and those were dropped (found
    in a chaos run: a partition sought back to its first offset stayed at offset 0 until the
    stall watch restarted the worker).

    Fails without it: ``tests/unit/runtime/faust_patches/test_consumer.py::
    test_read_offsets_drop_no_record_of_an_input_topic`` (no integration test forces the race:
    it was seen in a chaos run).
    """
    from faust.transport.consumer import Consumer

    Consumer.__init__ = _init_wrapper(Consumer.__init__)  # type: ignore[method-assign]


def _init_wrapper(original: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        app = self.app  # its topics (the conductor) are built later: looked up per record
        self._read_offset = ReadOffsets(lambda topic: app.topics.acks_enabled_for(topic))

    return __init__


class ReadOffsets(dict[Any, int | None]):
    """Faust's read offsets (``Consumer._read_offset``), which drop nothing of an input topic.

    Faust drops a fetched record whose offset is below its partition's read offset, as read
    already (``_drain_messages`` ~1209-1226); a seek sets the read offset to where it goes. But
    a record fetched before a seek and delivered after it (the rest of a fetch being handed
    out, or one whose delivery waited on a full agent queue) sets the read offset again, past
    the records the seek is to read again: those are dropped, never handled, and hold the
    partition's commit for ever. For a topic whose records are acknowledged this mapping
    answers "nothing read yet", so every record fetched is delivered; one read twice is handled
    twice (at-least-once; effects are idempotent). Other topics (changelogs) keep Faust's rule.

    >>> from faust.types import TP
    >>> offsets = ReadOffsets(lambda topic: topic == "in")
    >>> offsets[TP("in", 0)] = 40
    >>> offsets[TP("changelog", 0)] = 40
    >>> offsets[TP("in", 0)], offsets[TP("changelog", 0)], offsets[TP("changelog", 1)]
    (None, 40, None)
    """

    __slots__ = ("_acks_enabled_for",)

    def __init__(self, acks_enabled_for: Any) -> None:
        super().__init__()
        self._acks_enabled_for = acks_enabled_for

    def __getitem__(self, tp: Any) -> int | None:
        if self._acks_enabled_for(tp.topic):
            return None
        return self.get(tp)


# -- changelog records thrown away during a table recovery --------------------------------------


def install_reread_thrown_changelogs() -> None:
    """``Consumer.getmany`` reads again the changelog records it throws away while a table
    recovery reads them: such a partition is sought back to the record after the last one the
    recovery read (:func:`.offsets.reread_from`); records read twice are skipped by the
    recovery.

    Upstream: Faust drops a fetch that returns while the flow is stopped (~758-766) and seeks
    back to the committed offsets; a changelog partition has none, so its fetcher stayed past
    the records, and a recovery that still needed them waited for ever ("No event received for
    active tp ... since recovery start", faust-streaming/faust#629). With the recovery's seek
    coming right after the assignment (``stream_recovery_delay`` is 0), a fetch begun before
    the rebalance returns in that window.

    Fails without it: ``tests/integration/test_handover.py::
    test_changelog_records_thrown_away_during_recovery_are_read_again``.
    """
    from faust.transport.consumer import Consumer

    Consumer.getmany = _getmany  # type: ignore[method-assign]


async def _getmany(self: Any, timeout: float) -> Any:
    """Faust 0.15.3's ``Consumer.getmany`` (``transport/consumer.py`` ~693), which also reads
    again the changelog records it throws away while a recovery reads them (see above)."""
    records, active_partitions = await self._wait_next_records(timeout)
    generation_id = self.app.consumer_generation_id
    if records is None or self.should_stop:
        return
    delivered: dict[Any, set[int]] = {}
    records_it = self.scheduler.iterate(records)
    to_message = self._to_message  # localize
    if self.flow_active:
        for tp, record in records_it:
            if not self.flow_active:
                break
            new_generation_id = self.app.consumer_generation_id
            if new_generation_id != generation_id:
                self.log.dev(
                    "Generation id changed from %r to %r. Cancelling getmany.",
                    generation_id,
                    new_generation_id,
                )
                break
            if (
                active_partitions is None
                or tp in active_partitions
                or tp in self._buffered_partitions
            ):
                highwater_mark = self.highwater(tp)
                self.app.monitor.track_tp_end_offset(tp, highwater_mark)
                delivered.setdefault(tp, set()).add(record.offset)
                # convert timestamp to seconds from int milliseconds.
                yield tp, to_message(tp, record)
    else:
        self.log.dev("getmany called while flow not active. Seek back to committed offsets.")
        try:
            await self.perform_seek()
        except Exception as ex:
            self.log.warning(f"exception performing seek when flow not active {ex}")
    if len(delivered) < len(records) or any(
        len(delivered.get(tp, ())) < len(recs) for tp, recs in records.items()
    ):
        await _reread_changelogs(self, records, delivered)


async def _reread_changelogs(
    consumer: Any, records: Mapping[Any, Sequence[Any]], delivered: Mapping[Any, set[int]]
) -> None:
    """Seek back the recovering changelog partitions of a fetch Faust threw away: the seek to
    the committed offsets that Faust counts on does not move them (they have none), so the
    recovery would wait for records its fetcher is already past, for ever."""
    app = consumer.app
    if not app.in_recovery:
        return  # the next recovery seeks its partitions itself
    changelogs = {
        tp: [r.offset for r in recs]
        for tp, recs in records.items()
        if recs and consumer._is_changelog_tp(tp)
    }
    recovery = app.tables.recovery
    for tp, last in dropped_fetched(changelogs, delivered).items():
        if tp in recovery.active_tps:
            seen = recovery.active_offsets.get(tp)
        elif tp in recovery.standby_tps:
            seen = recovery.standby_offsets.get(tp)
        else:
            continue
        offset = reread_from(seen, last)
        if offset is None:
            continue
        consumer.log.warning(
            "changelog records %s[%s] ..%s fetched during recovery were thrown away "
            "(a fetch returned while the flow was stopped): reading them again from %s",
            tp.topic,
            tp.partition,
            last,
            offset,
        )
        try:
            await consumer.seek(tp, offset)
        except Exception as exc:  # revoked meanwhile: the next recovery seeks it
            consumer.log.warning("changelog %r not read again: %r", tp, exc)
