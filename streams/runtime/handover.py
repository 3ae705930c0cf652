"""A patch of faust-streaming 0.15.3 that closes the record loss at a partition hand-over.

What it holds: :func:`install`, which patches three places of Faust's consumer and table
recovery, once per process, before the Faust app is built; the pure offset rules it relies on
(:func:`fetched_gaps`, :func:`committable`), tested without a broker; and test-only hooks
(environment variables ``TESTONLY_TRAJSTREAM_*``, below) that slow agents, widen the race and
record what agents handled, so an integration test can reproduce the loss every time.
It may import faust, mode and the standard library, and nothing else of trajstream but errors.

The loss, as read in the installed 0.15.3 (line numbers of that version):

1. ``tables/recovery.py`` ``Recovery.on_recovery_completed`` (~649) resumes the stream
   partitions while the fetcher and flow control already run: records are handed to the agents'
   queues and ``Consumer._read_offset`` advances (``transport/consumer.py`` ~1223).
2. It then seeks to the committed offsets (``Consumer.perform_seek`` ~566): the read offsets are
   reset while deliveries go on; the records delivered between the seek and that reset advance
   them again and are then forgotten by the reset.
3. ``app.flow_control.resume()`` (~659) clears every agent's input queue (``mode/utils/queues.py``
   ``FlowControlEvent.resume`` ~97; channels are built with ``clear_on_resume=True``): records
   delivered but not yet taken vanish, never acknowledged. Fetched again, those below the read
   offset are dropped as already read (``consumer.py`` ~1209/1226).
4. The commit then passes them: the next delivery records a "gap" from the reset read offset to
   its own offset (~1215), and ``Consumer._new_offset`` counts gaps as acknowledged (~1117); or a
   hole of one record right at the committed offset passes ``min(acked) - committed > 1`` (~1140,
   the off-by-one of faust-streaming#606; an offset of 0 even skips the test, ``if committed``).

Upstream: faust-streaming/faust#596 (gaps in acked offsets that skew commits, open), #606 (the
off-by-one, fix PR #707 not merged), #216/#217 and #221/#223 (earlier hand-over fixes whose
order this keeps).

The patch, in the order the record flows:

- ``Recovery.on_recovery_completed``: the queues are cleared *before* the stream partitions are
  resumed, never after, so no queue is cleared under records already read. Nothing of a stream
  partition can be in a queue then (revocation cleared them, ``app/base.py`` ~1823, and the
  partitions stayed paused). The seek still comes *after* the resume, as upstream (#217): seeking
  first would pause every partition, and aiokafka's ``fetched_records`` reads an empty set of
  partitions as "all" (``aiokafka/consumer/fetcher.py`` ~1221), whose records Faust drops
  (``consumer.py`` ~758). Records delivered before the seek stay queued and are handled; the seek
  may deliver some of them again (at-least-once; every effect here is idempotent).
- Gaps are learnt from the fetcher, not from the read offset: an offset counts as a gap only if
  two records returned one after the other for a partition, in one fetch epoch (no seek and no
  rebalance in between or during the fetch), skip it; such offsets do not exist in the log
  (compaction, transaction markers). ``Consumer._add_gap``, fed by the resettable read offset,
  does nothing.
- ``Consumer._new_offset`` commits only a contiguous run of acknowledged (or gap) offsets that
  starts exactly at the committed offset (0 included); a hole at the head holds the commit. A
  partition whose committed offset is not known yet (``None``: between an assignment and the
  end of the seek that follows it) commits nothing: upstream starts the run at the lowest
  offset acknowledged, and a commit made while the seek was on its way passed records a
  rebalance had dropped (found in a chaos run on a loaded machine: the seek took 1.3 s, the
  table recovery had started the fetcher, and the commit timer passed five records).
- ``Consumer._read_offset`` is a :class:`ReadOffsets`, which never drops a record of an input
  topic as read already: a record fetched before a seek and delivered after it moved the read
  offset past the records the seek was to read again, and those were dropped.
- ``Consumer.perform_seek`` keeps a committed offset of 0 (upstream stores it as ``None``) and
  never moves the committed offset back: the committed offsets it reads may predate a commit
  made while it waited (upstream then forgets that commit; with the strict rule above, the
  offsets committed since would be a hole that holds every later commit). For a partition the
  group never committed it takes the partition's first offset as the committed one (reading
  starts there: ``auto.offset.reset`` is ``earliest``); upstream leaves it unknown and the run
  then starts at the lowest offset acknowledged, so a record at the head of a new partition
  that a hand-over dropped was passed by the first commit after it (found in the fault tests:
  the first record of a ``<p>.rewarded`` partition, fetched just before a rebalance, never fed
  back). A record dropped in a worker now holds its partition's commit until a hand-over or a
  restart reads it again, instead of being passed. It also forgets the acknowledgements made
  before it: every partition is read again from its committed offset, and Faust's stream
  acknowledges an event it skips unhandled while a rebalance has the flow stopped
  (``streams.py`` ~1287/1342). The first offsets are asked for again a few times; while not
  known, the partition commits nothing.

- ``Consumer.getmany`` reads again the changelog records it throws away while a table recovery
  reads them. Faust drops a fetch that returns while the flow is stopped (~758-766) and seeks
  back to the committed offsets; a changelog partition has none, so its fetcher stayed past the
  records, and a recovery that still needed them waited for ever ("No event received for active
  tp ... since recovery start", faust-streaming#629). With the recovery's seek coming right
  after the assignment (``stream_recovery_delay`` is 0), a fetch begun before the rebalance
  returns in that window. Such a partition is sought back to the record after the last one
  the recovery read (:func:`reread_from`); records read twice are skipped by the recovery.

What it costs: after a seek, an offset missing at the very head of the first fetch (a
transaction marker or compacted record right at the committed offset) is not learnt as a gap and
holds that partition's commit until the worker restarts. trajstream's input topics are neither
transactional nor compacted. A record fetched before a seek back may be handled twice, and a
partition whose first offset the broker would not give commits nothing until the next
rebalance or restart (the stall watch restarts such a worker).

Test-only hooks (read once by :func:`install`; never set them in production):

- ``TESTONLY_TRAJSTREAM_HANDOVER_UNPATCHED=1``: install only the hooks below, not the patch, to
  show the loss the patch prevents.
- ``TESTONLY_TRAJSTREAM_SEEK_DELAY_S=<s>``: sleep between the seek to the committed offsets and
  the reset of the read offsets (inside ``perform_seek``), widening step 2.
- ``TESTONLY_TRAJSTREAM_AGENT_DELAY_S=<s>``: every agent sleeps this long per event, so agents
  lag behind the fetcher as on a loaded machine.
- ``TESTONLY_TRAJSTREAM_ACK_LOG=<path>``: append ``topic partition offset`` for every record an
  agent finished with (Faust's acknowledgement), to check that no committed offset passed one.
  It sees ``Consumer.ack``, which Faust's Cython stream iterator inlines: run the worker with
  ``NO_CYTHON=1`` (Faust's own switch) for a complete log. The patch itself works on the
  bookkeeping both iterators share (``_acked``, ``_acked_index``, ``_gap``).
- ``TESTONLY_TRAJSTREAM_DROP_FETCHED=<topic>:<partition>``: what the consumer fetches of that
  partition never reaches the agents (a partition that makes no progress, as in
  faust-streaming#629: for the progress watch, :mod:`streams.observe.progress`).
- ``TESTONLY_TRAJSTREAM_DROP_BEFORE_SEEK=<topic>``: at the first seek to the committed offsets
  that finds partitions of ``<topic>`` holding records and never committed, the records the
  fetcher has buffered for them are taken and thrown away first, as Faust throws away a fetch
  that returns while a rebalance stops the flow (``consumer.py`` ~758-766, "getmany called
  while flow not active. Seek back to committed offsets"), counting on the seek to read them
  again. The worker logs a warning saying what it dropped.
- ``TESTONLY_TRAJSTREAM_STOP_FLOW_IN_RECOVERY=1``: the first fetch of a table recovery that
  returns changelog records the recovery still needs stops the flow as it returns (as a
  rebalance starting at that moment does) and resumes it a second later, so that Faust's
  ``getmany`` throws the fetch away (~768). The worker logs a warning saying what it returned.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from itertools import pairwise
from typing import Any, TextIO

from ..errors import HandoverPatchError

__all__ = [
    "FAUST_VERSION",
    "HandoverPatchError",
    "ReadOffsets",
    "committable",
    "dropped_fetched",
    "fetched_gaps",
    "install",
    "installed",
    "reread_from",
]

FAUST_VERSION = "0.15.3"
"""The only faust-streaming version this patch was read against and tested with."""

_ENV_UNPATCHED = "TESTONLY_TRAJSTREAM_HANDOVER_UNPATCHED"
_ENV_SEEK_DELAY = "TESTONLY_TRAJSTREAM_SEEK_DELAY_S"
_ENV_AGENT_DELAY = "TESTONLY_TRAJSTREAM_AGENT_DELAY_S"
_ENV_ACK_LOG = "TESTONLY_TRAJSTREAM_ACK_LOG"
_ENV_DROP_FETCHED = "TESTONLY_TRAJSTREAM_DROP_FETCHED"
_ENV_DROP_BEFORE_SEEK = "TESTONLY_TRAJSTREAM_DROP_BEFORE_SEEK"
_ENV_STOP_FLOW_IN_RECOVERY = "TESTONLY_TRAJSTREAM_STOP_FLOW_IN_RECOVERY"

_state: dict[str, Any] = {"patched": False, "hooks": False}


# -- the offset rules, pure --------------------------------------------------------------------


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


# -- the patch ---------------------------------------------------------------------------------


def installed() -> bool:
    """Whether the patch (not only the test hooks) is active in this process."""
    return bool(_state["patched"])


def install(environ: Mapping[str, str] | None = None) -> None:
    """Patch Faust once per process; call before the Faust app is built.

    Raises :class:`HandoverPatchError` on a faust-streaming version other than
    :data:`FAUST_VERSION`: the patched methods are copies of that version's code.
    """
    env = os.environ if environ is None else environ
    version = metadata.version("faust-streaming")
    if version != FAUST_VERSION:
        raise HandoverPatchError(
            f"streams.runtime.handover patches faust-streaming {FAUST_VERSION}, found {version}: "
            "re-read the hand-over code of that version (see this module's docstring) and "
            "update the patch, or install faust-streaming=={FAUST_VERSION}"
        )
    if not _state["hooks"]:
        _install_test_hooks(env)
        _state["hooks"] = True
    if env.get(_ENV_UNPATCHED) == "1" or _state["patched"]:
        return
    _patch()
    _state["patched"] = True


def _patch() -> None:
    from faust.tables.recovery import Recovery
    from faust.transport.consumer import Consumer

    Recovery.on_recovery_completed = _on_recovery_completed  # type: ignore[method-assign]
    Consumer.perform_seek = _perform_seek  # type: ignore[method-assign]
    Consumer._new_offset = _new_offset  # type: ignore[method-assign]
    Consumer._add_gap = _add_gap  # type: ignore[method-assign]
    Consumer.seek = _seek_wrapper(Consumer.seek)  # type: ignore[method-assign]
    Consumer._wait_next_records = _fetch_wrapper(  # type: ignore[method-assign]
        Consumer._wait_next_records
    )
    Consumer.getmany = _getmany  # type: ignore[method-assign]
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
    partition's commit for ever (found in a chaos run: a partition sought back to its first
    offset stayed at offset 0 until the stall watch restarted the worker). For a topic whose
    records are acknowledged this mapping answers "nothing read yet", so every record fetched
    is delivered; one read twice is handled twice (at-least-once; effects are idempotent).
    Other topics (changelogs) keep Faust's rule.

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


async def _getmany(self: Any, timeout: float) -> Any:
    """Faust 0.15.3's ``Consumer.getmany`` (``transport/consumer.py`` ~693), which also reads
    again the changelog records it throws away while a recovery reads them (see the module)."""
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
    ``tps`` themselves: where reading starts, so where a commit's run starts (see the module's
    docstring). Tried again a few times; while it is not known the partitions commit nothing
    (a committed offset unknown holds the commit), until the next rebalance or restart."""
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


def _seek_wrapper(original: Any) -> Any:
    async def seek(self: Any, partition: Any, offset: int) -> None:
        _forget_positions(self, [partition])
        await original(self, partition, offset)
        _forget_positions(self, [partition])

    return seek


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


# -- test-only hooks ---------------------------------------------------------------------------


def _install_test_hooks(env: Mapping[str, str]) -> None:
    seek_delay = float(env.get(_ENV_SEEK_DELAY) or 0)
    agent_delay = float(env.get(_ENV_AGENT_DELAY) or 0)
    ack_log = env.get(_ENV_ACK_LOG)
    drop = env.get(_ENV_DROP_FETCHED)
    if drop:
        from faust.transport.consumer import ThreadDelegateConsumer

        topic, _, partition = drop.rpartition(":")
        dropped = (topic, int(partition))
        original_getmany = ThreadDelegateConsumer._getmany

        async def _getmany(self: Any, active_partitions: Any, timeout: float) -> Any:
            records = await original_getmany(self, active_partitions, timeout)
            return {tp: r for tp, r in records.items() if (tp.topic, tp.partition) != dropped}

        ThreadDelegateConsumer._getmany = _getmany  # type: ignore[method-assign]
    drop_before_seek = env.get(_ENV_DROP_BEFORE_SEEK)
    if drop_before_seek:
        from faust.transport.consumer import ThreadDelegateConsumer

        original_seek_to_committed = ThreadDelegateConsumer.seek_to_committed

        async def seek_to_committed_dropping(self: Any) -> Mapping[Any, int]:
            if not _state.get("dropped_before_seek"):
                thread = self._thread
                dropped = await thread.call_thread(
                    _drop_fetched, thread._ensure_consumer(), drop_before_seek
                )
                if dropped:
                    _state["dropped_before_seek"] = True
                    self.log.warning(
                        "testonly: dropped fetched records before the seek: %s", dropped
                    )
            return await original_seek_to_committed(self)

        ThreadDelegateConsumer.seek_to_committed = seek_to_committed_dropping  # type: ignore[method-assign]
    if env.get(_ENV_STOP_FLOW_IN_RECOVERY) == "1":
        _hook_stop_flow_in_recovery()
    if seek_delay > 0:
        from faust.transport.consumer import ThreadDelegateConsumer

        original_seek = ThreadDelegateConsumer.seek_to_committed

        async def seek_to_committed(self: Any) -> Mapping[Any, int]:
            result = await original_seek(self)
            await asyncio.sleep(seek_delay)
            return result

        ThreadDelegateConsumer.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
    if agent_delay > 0:
        import faust.streams

        async def slow(value: Any) -> Any:
            await asyncio.sleep(agent_delay)
            return value

        original_init = faust.streams.Stream.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            if slow not in self._processors:
                self._processors.insert(0, slow)

        faust.streams.Stream.__init__ = __init__  # type: ignore[method-assign]
    if ack_log:
        from faust.transport.consumer import Consumer

        log: TextIO = open(ack_log, "a", buffering=1)
        original_ack = Consumer.ack

        def ack(self: Any, message: Any) -> bool:
            first = not message.acked
            result: bool = original_ack(self, message)
            if first and message.acked:
                log.write(f"{message.topic} {message.partition} {message.offset}\n")
            return result

        Consumer.ack = ack  # type: ignore[method-assign]


def _seen(offset: int | None) -> int:
    return -1 if offset is None else offset


def _hook_stop_flow_in_recovery() -> None:
    """The first fetch of a recovery that returns changelog records the recovery still needs
    stops the flow as it returns, as a rebalance starting then does, and resumes it a second
    later: Faust's own ``getmany`` throws that fetch away."""
    from faust.transport.consumer import Consumer

    original = Consumer._wait_next_records

    async def _wait_next_records(self: Any, timeout: float) -> Any:
        records, active = await original(self, timeout)
        if records and not _state.get("stopped_flow_in_recovery") and self.app.in_recovery:
            recovery = self.app.tables.recovery
            needed = {
                f"{tp.topic}[{tp.partition}]": f"{recs[0].offset}..{recs[-1].offset}"
                for tp, recs in records.items()
                if recs
                and tp in recovery.active_tps
                and _seen(recovery.active_offsets.get(tp)) < recs[-1].offset
            }
            if needed:
                _state["stopped_flow_in_recovery"] = True
                self.stop_flow()
                asyncio.get_running_loop().call_later(1.0, self.resume_flow)
                self.log.warning(
                    "testonly: stopped the flow as a recovery fetch returned: %s", needed
                )
        return records, active

    Consumer._wait_next_records = _wait_next_records  # type: ignore[method-assign]


async def _drop_fetched(consumer: Any, topic: str, wait_s: float = 10.0) -> dict[str, str]:
    """On the consumer's own thread: take what the aiokafka fetcher buffered for the partitions
    of ``topic`` that hold records and have no committed offset, and throw it away (waits up to
    ``wait_s`` for a first record of each). Returns ``{"topic[p]": "lo..hi"}`` of what went."""
    import time

    tps = [tp for tp in consumer.assignment() if tp.topic == topic]
    if not tps:
        return {}
    ends = await consumer.end_offsets(tps)
    wanted = {tp for tp in tps if ends.get(tp) and await consumer.committed(tp) is None}
    dropped: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    while wanted and time.monotonic() < deadline:
        fetched = await consumer._fetcher.fetched_records(list(wanted), timeout=0.5)
        for tp, records in fetched.items():
            if records:
                dropped[f"{tp.topic}[{tp.partition}]"] = (
                    f"{records[0].offset}..{records[-1].offset}"
                )
                wanted.discard(tp)
    return dropped
