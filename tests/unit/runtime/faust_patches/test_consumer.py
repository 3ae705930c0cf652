"""The consumer patches (streams/runtime/faust_patches/consumer.py), through Faust's own
``Consumer`` class as installed: each of these tests fails where the patch it exercises is left
out (``TESTONLY_TRAJSTREAM_WITHOUT_PATCHES=<name>``, see this folder's conftest)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import Consumer
from faust.types import TP
from intervaltree import IntervalTree

from streams.runtime.faust_patches import consumer as patched

TOPIC = TP("t.agent-events", 0)


def _consumer(committed: int | None, tp: Any = TOPIC) -> Any:
    c = SimpleNamespace(
        _acked=defaultdict(list),
        _acked_index=defaultdict(set),
        _gap=defaultdict(IntervalTree),
        _committed_offset=defaultdict(lambda: None),
        app=SimpleNamespace(
            consumer_generation_id=1,
            topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
        ),
    )
    c._committed_offset[tp] = committed
    return c


def _ack(c: Any, tp: Any, *offsets: int) -> None:
    for o in offsets:
        c._acked[tp].append(o)
        c._acked_index[tp].add(o)


# -- consumer.gaps_from_fetches -----------------------------------------------------------------


def test_a_gap_from_a_reset_read_offset_passes_nothing() -> None:
    """Upstream: after a seek reset the read offset to 15, the next delivery (40) made a gap
    16..39 of records dropped unhandled, and the commit counted them as done."""
    c = _consumer(15)
    asyncio.run(Consumer._add_gap(c, TOPIC, 16, 39))
    _ack(c, TOPIC, 15, 40, 41)
    assert Consumer._new_offset(c, TOPIC) == 16
    c._committed_offset[TOPIC] = 16  # committed (Faust sets it after the commit)
    _ack(c, TOPIC, *range(16, 40))
    assert Consumer._new_offset(c, TOPIC) == 42


def test_gaps_learnt_from_the_fetch_fill_the_run() -> None:
    c = _consumer(10)
    records = {TOPIC: [SimpleNamespace(offset=o) for o in (10, 11, 14)]}
    patched._learn_gaps(c, records)
    _ack(c, TOPIC, 10, 11, 14)
    assert Consumer._new_offset(c, TOPIC) == 15
    # a fetch in a new epoch after a seek: its first record says nothing about before it
    c.__dict__["_th_last"] = {}
    patched._learn_gaps(c, {TOPIC: [SimpleNamespace(offset=20)]})
    c._committed_offset[TOPIC] = 15
    _ack(c, TOPIC, 20)
    assert Consumer._new_offset(c, TOPIC) is None


# -- consumer.contiguous_commit -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("committed", "acked"),
    [
        (15, [16, 17]),  # faust-streaming#606: a hole of one record at the committed offset
        (0, [1, 2]),  # upstream skips its test for an offset of 0
        (None, [13, 14, 15]),  # committed offset not known yet: the run starts nowhere
    ],
)
def test_a_hole_at_the_committed_offset_holds_the_commit(
    committed: int | None, acked: list[int]
) -> None:
    c = _consumer(committed)
    _ack(c, TOPIC, *acked)
    assert Consumer._new_offset(c, TOPIC) is None


# -- consumer.seek_keeps_committed --------------------------------------------------------------


def test_the_seek_never_moves_the_committed_offset_back() -> None:
    """The broker's committed offsets, read at the seek, may predate this worker's own commit."""
    tp = TP("t", 0)
    c = _consumer(None, tp)
    c._read_offset = {}
    c._committed_offset[tp] = 40  # committed by this worker while the seek was on its way

    async def seek_to_committed() -> dict[Any, int]:
        return {tp: 15}

    c.seek_to_committed = seek_to_committed
    asyncio.run(Consumer.perform_seek(c))
    assert c._committed_offset[tp] == 40
    assert c._read_offset[tp] == 15  # records from 15 are fetched again (at-least-once)
    _ack(c, tp, 40, 41)
    assert Consumer._new_offset(c, tp) == 42


def _seeking(c: Any, committed: dict[Any, int | None], first: Any) -> list[tuple[Any, ...]]:
    """Give ``c`` the broker's committed offsets and first offsets; return the first-offset
    requests it made."""
    asked: list[tuple[Any, ...]] = []

    async def seek_to_committed() -> dict[Any, int | None]:
        return dict(committed)

    async def earliest_offsets(*tps: Any) -> dict[Any, int]:
        asked.append(tps)
        if isinstance(first, Exception):
            raise first
        return {tp: first[tp] for tp in tps}

    async def seek(tp: Any, offset: int) -> None:
        c.seeks.append((tp, offset))

    c._read_offset = {}
    c.seeks = []
    c.seek_to_committed = seek_to_committed
    c.earliest_offsets = earliest_offsets
    c.seek = seek
    c.log = SimpleNamespace(warning=lambda *a, **k: None)
    return asked


def test_a_partition_never_committed_holds_its_commit_until_its_first_record_is_done() -> None:
    """A record at the head of a new partition, lost at a hand-over (fetched before a
    rebalance, never handled), was passed by the first commit of the records after it: Faust
    started the run at the lowest offset acknowledged. Seen live: one call never fed back."""
    tp, changelog = TP("t.rewarded", 0), TP("app-pending-changelog", 0)
    c = _consumer(None, tp)
    c.app.topics.acks_enabled_for = lambda topic: topic == tp.topic
    asked = _seeking(c, {tp: None, changelog: None}, {tp: 0, changelog: 0})
    asyncio.run(Consumer.perform_seek(c))
    assert asked == [(tp,)]  # only the partitions whose offsets are committed
    assert c._committed_offset[tp] == 0
    assert c.seeks == [(tp, 0)]  # read again from there, whatever the fetcher had read
    assert c._read_offset[tp] is None  # the fetch starts where the consumer resets it
    _ack(c, tp, 1, 2)
    assert Consumer._new_offset(c, tp) is None
    _ack(c, tp, 0)
    assert Consumer._new_offset(c, tp) == 3


def test_a_partition_whose_log_starts_later_starts_its_run_there() -> None:
    tp = TP("t.rewarded", 1)
    c = _consumer(None, tp)
    _seeking(c, {tp: None}, {tp: 7})  # retention deleted 0..6
    asyncio.run(Consumer.perform_seek(c))
    assert c.seeks == [(tp, 7)]
    _ack(c, tp, 7, 8)
    assert Consumer._new_offset(c, tp) == 9


def test_first_offsets_unknown_hold_the_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust's rule for an unknown committed offset (the run starts at the lowest offset
    acknowledged) passed records dropped below it: seen in a chaos run, where a commit made
    while the first offsets were asked for passed five records never handled."""
    monkeypatch.setattr(patched, "FIRST_OFFSET_RETRIES_S", (0, 0))
    tp = TP("t.rewarded", 2)
    c = _consumer(None, tp)
    asked = _seeking(c, {tp: None}, OSError("broker gone"))
    asyncio.run(Consumer.perform_seek(c))  # does not raise
    assert len(asked) == 3  # tried again
    assert c._committed_offset[tp] is None
    assert c.seeks == []  # the fetcher's own position
    _ack(c, tp, 13, 14, 15)
    assert Consumer._new_offset(c, tp) is None  # held: nothing says 0..12 were handled


def test_first_offsets_read_at_a_later_try() -> None:
    tp = TP("t.rewarded", 3)
    c = _consumer(None, tp)
    asked = _seeking(c, {tp: None}, {tp: 0})
    answers = iter([OSError("not the leader yet"), None])
    ask = c.earliest_offsets

    async def earliest_offsets(*tps: Any) -> dict[Any, int]:
        error = next(answers)
        if error is not None:
            asked.append(tps)
            raise error
        return await ask(*tps)  # type: ignore[no-any-return]

    c.earliest_offsets = earliest_offsets
    asyncio.run(Consumer.perform_seek(c))
    assert len(asked) == 2
    assert c._committed_offset[tp] == 0 and c.seeks == [(tp, 0)]


def test_a_commit_while_the_first_offsets_are_asked_for_is_kept() -> None:
    """A committed offset set while the first offsets were on their way (a second seek beside
    this one) is not moved back to the partition's first offset."""
    tp = TP("t.rewarded", 0)
    c = _consumer(None, tp)
    _seeking(c, {tp: None}, {tp: 0})
    ask = c.earliest_offsets

    async def earliest_offsets(*tps: Any) -> dict[Any, int]:
        c._committed_offset[tp] = 19
        return await ask(*tps)  # type: ignore[no-any-return]

    c.earliest_offsets = earliest_offsets
    asyncio.run(Consumer.perform_seek(c))
    assert c._committed_offset[tp] == 19
    assert c.seeks == []


def test_acknowledgements_before_the_seek_are_forgotten() -> None:
    """Faust's stream acknowledges an event it skips unhandled while a rebalance has the flow
    stopped; kept, that acknowledgement would fill the run the seek's re-reading builds."""
    tp = TP("t.agent-events", 0)
    c = _consumer(None, tp)
    _ack(c, tp, 55)  # skipped during the revoke, never handled
    _seeking(c, {tp: 50}, {})
    asyncio.run(Consumer.perform_seek(c))
    assert c._committed_offset[tp] == 50
    assert c._acked[tp] == [] and c._acked_index[tp] == set()
    _ack(c, tp, *range(50, 55))  # read again from 50; 55 on its way, not handled yet
    assert Consumer._new_offset(c, tp) == 55
    c._committed_offset[tp] = 55  # committed (Faust sets it after the commit)
    _ack(c, tp, 55)
    assert Consumer._new_offset(c, tp) == 56


def test_a_partition_committed_or_known_is_not_asked_again() -> None:
    a, b = TP("t.rewarded", 0), TP("t.rewarded", 1)
    c = _consumer(None, a)
    c._committed_offset[b] = 4  # learnt by this worker (its own commit) since the assignment
    asked = _seeking(c, {a: 12, b: None}, {a: 0, b: 0})
    asyncio.run(Consumer.perform_seek(c))
    assert asked == []
    assert (c._committed_offset[a], c._committed_offset[b]) == (12, 4)
    assert c.seeks == [(b, 4)]  # the broker has no offset for it yet: read from this worker's


# -- consumer.no_drop_as_read -------------------------------------------------------------------


def test_read_offsets_drop_no_record_of_an_input_topic() -> None:
    """After a seek back, a record fetched before it and delivered after it set the read offset
    past the records to read again, and Faust dropped those as read already: the partition's
    commit stayed at its head (seen in a chaos run: stalled at offset 0 until restarted)."""
    import faust

    app = faust.App("read-offsets-test", broker="kafka://127.0.0.1:1")
    consumer = app.consumer
    assert isinstance(consumer._read_offset, patched.ReadOffsets)
    app.topics._acking_topics.add("read-offsets-in")  # as the conductor does at subscription
    tp, changelog = TP("read-offsets-in", 0), TP("read-offsets-changelog", 0)
    consumer._read_offset[tp] = 25  # a delivery from before the seek, after it
    consumer._read_offset[changelog] = 25
    read = consumer._read_offset.__getitem__  # how Faust's _drain_messages reads it
    assert read(tp) is None  # record 0, fetched again, is delivered
    assert read(changelog) == 25
    assert read(TP("read-offsets-changelog", 1)) is None


# -- consumer.reread_thrown_changelogs ----------------------------------------------------------


def test_a_changelog_fetch_thrown_away_during_recovery_is_read_again() -> None:
    """Faust throws away a fetch that returns while the flow is stopped and seeks back to the
    committed offsets, which a changelog partition has not: the recovery waited for ever for the
    records its fetcher was past (faust-streaming#629)."""
    changelog, standby, other = (
        TP("app-pending-changelog", 0),
        TP("app-pending-changelog", 1),
        TP("app-closed-changelog", 0),
    )
    fetched = {
        changelog: [SimpleNamespace(offset=o) for o in range(53, 80)],
        standby: [SimpleNamespace(offset=o) for o in range(10, 12)],
        other: [SimpleNamespace(offset=4)],
    }
    seeks: list[tuple[Any, int]] = []

    async def wait_next_records(timeout: float) -> Any:
        return fetched, None

    async def nothing() -> None:
        return None

    async def seek(tp: Any, offset: int) -> None:
        seeks.append((tp, offset))

    recovery = SimpleNamespace(
        active_tps={changelog, other},
        active_offsets={changelog: 52, other: 9},  # other: read past what went already
        standby_tps={standby},
        standby_offsets={standby: -1},
    )
    c = SimpleNamespace(
        _wait_next_records=wait_next_records,
        app=SimpleNamespace(
            consumer_generation_id=1, in_recovery=True, tables=SimpleNamespace(recovery=recovery)
        ),
        should_stop=False,
        scheduler=SimpleNamespace(iterate=lambda records: iter(())),
        _to_message=None,
        flow_active=False,  # a rebalance stopped the flow as the fetch returned
        perform_seek=nothing,
        _is_changelog_tp=lambda tp: tp.topic.endswith("-changelog"),
        log=SimpleNamespace(dev=lambda *a: None, warning=lambda *a: None),
        seek=seek,
    )

    async def drain() -> list[Any]:
        return [message async for message in Consumer.getmany(c, 1.0)]

    assert asyncio.run(drain()) == []
    assert sorted(seeks) == [(changelog, 53), (standby, 0)]
