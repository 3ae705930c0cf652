"""The hand-over patch's offset rules, its order of recovery steps, and its version pin."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from intervaltree import IntervalTree

from streams.runtime import handover
from streams.runtime.handover import committable, fetched_gaps


@pytest.mark.parametrize(
    ("previous", "offsets", "gaps"),
    [
        (None, [], []),
        (None, [5, 6, 7], []),
        (None, [5, 8], [(6, 7)]),
        (4, [5, 6], []),
        (4, [7], [(5, 6)]),
        (4, [4, 5], []),  # fetched again after a seek back: no gap
        (9, [5, 6], []),
    ],
)
def test_fetched_gaps(
    previous: int | None, offsets: list[int], gaps: list[tuple[int, int]]
) -> None:
    assert fetched_gaps(previous, offsets) == gaps


@pytest.mark.parametrize(
    ("committed", "done", "expected"),
    [
        (15, [16, 17], None),  # #606: a one-record hole at the committed offset holds
        (15, [15, 16, 18], 17),
        (0, [1, 2], None),  # upstream skips its test for an offset of 0
        (0, [0, 1], 2),
        (None, [3, 4, 6], None),  # committed offset not known yet: where the run starts isn't
        (10, [3, 4], None),  # stale, below the committed offset
        (10, [8, 9, 10, 11], 12),
        (10, [], None),
    ],
)
def test_committable(committed: int | None, done: list[int], expected: int | None) -> None:
    assert committable(committed, done) == expected


@given(
    committed=st.integers(0, 50),
    done=st.sets(st.integers(0, 80)),
)
def test_a_commit_never_passes_an_offset_not_done(committed: int, done: set[int]) -> None:
    offset = committable(committed, done)
    if offset is not None:
        assert offset > committed
        assert set(range(committed, offset)) <= done


def _consumer(committed: int | None) -> Any:
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
    c._committed_offset["tp"] = committed
    return c


def _ack(c: Any, *offsets: int) -> None:
    for o in offsets:
        c._acked["tp"].append(o)
        c._acked_index["tp"].add(o)


def test_gap_from_a_reset_read_offset_passes_nothing() -> None:
    """Upstream: the reset read offset (15) and the next delivery (40) made a gap 16..40."""
    c = _consumer(15)
    asyncio.run(handover._add_gap(c, "tp", 16, 40))
    _ack(c, 40, 41)
    assert handover._new_offset(c, "tp") is None
    _ack(c, *range(15, 40))
    assert handover._new_offset(c, "tp") == 42


def test_gaps_learnt_from_the_fetch_fill_the_run() -> None:
    from faust.types import TP

    c = _consumer(10)
    key = TP("t", 0)
    c._committed_offset[key] = 10
    records = {key: [SimpleNamespace(offset=o) for o in (10, 11, 14)]}
    handover._learn_gaps(c, records)
    for o in (10, 11, 14):
        c._acked[key].append(o)
        c._acked_index[key].add(o)
    assert handover._new_offset(c, key) == 15
    # a fetch in a new epoch after a seek: its first record says nothing about before it
    c.__dict__["_th_last"] = {}
    handover._learn_gaps(c, {key: [SimpleNamespace(offset=20)]})
    c._committed_offset[key] = 15
    c._acked[key].append(20)
    c._acked_index[key].add(20)
    assert handover._new_offset(c, key) is None


def test_recovery_completion_clears_queues_before_resuming_then_seeks() -> None:
    calls: list[str] = []

    class Signal:
        async def send(self) -> None:
            calls.append("rebalance_complete")

    async def perform_seek() -> None:
        calls.append("seek")

    async def wait(coro: Any, timeout: float) -> None:
        await coro

    async def maybe_start() -> None:
        calls.append("fetcher")

    consumer = SimpleNamespace(
        assignment=lambda: {"stream", "changelog"},
        resume_partitions=lambda tps: calls.append(f"resume_partitions {sorted(tps)}"),
        perform_seek=perform_seek,
        resume_flow=lambda: calls.append("resume_flow"),
    )
    app = SimpleNamespace(
        consumer=consumer,
        consumer_generation_id=3,
        on_rebalance_complete=Signal(),
        flow_control=SimpleNamespace(resume=lambda: calls.append("clear+resume")),
        conf=SimpleNamespace(broker_request_timeout=1.0),
        _fetcher=SimpleNamespace(maybe_start=maybe_start),
        assignor=SimpleNamespace(assigned_standbys=lambda: set()),
        on_rebalance_end=lambda: calls.append("end"),
    )
    recovery = SimpleNamespace(
        app=app,
        log=SimpleNamespace(info=lambda *a: None, dev=lambda *a: None, warning=lambda *a: None),
        tables={},
        _set_recovery_ended=lambda: None,
        _is_changelog_tp=lambda tp: tp == "changelog",
        _wait=wait,
        completed=SimpleNamespace(set=lambda: calls.append("completed")),
        tables_ready=None,
    )
    recovery.tables = SimpleNamespace(
        values=lambda: [],
        on_actives_ready=lambda: None,
        on_standbys_ready=lambda: None,
    )
    asyncio.run(handover._on_recovery_completed(recovery, generation_id=3))
    assert calls[:5] == [
        "rebalance_complete",
        "clear+resume",
        "resume_partitions ['stream']",
        "seek",
        "completed",
    ]
    assert calls.count("clear+resume") == 1  # never again after the seek


def test_install_refuses_another_faust_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handover.metadata, "version", lambda name: "0.16.0")
    with pytest.raises(handover.HandoverPatchError, match=r"0\.15\.3, found 0\.16\.0"):
        handover.install({})


def test_install_patches_once() -> None:
    from faust.transport.consumer import Consumer

    handover.install({})
    handover.install({})
    assert handover.installed()
    assert Consumer._new_offset is handover._new_offset


def test_the_seek_never_moves_the_committed_offset_back() -> None:
    """The broker's committed offsets, read at the seek, may predate this worker's own commit."""
    from faust.types import TP

    tp = TP("t", 0)
    c = _consumer(None)
    c._read_offset = {}
    c._committed_offset[tp] = 40  # committed by this worker while the seek was on its way

    async def seek_to_committed() -> dict[Any, int]:
        return {tp: 15}

    c.seek_to_committed = seek_to_committed
    asyncio.run(handover._perform_seek(c))
    assert c._committed_offset[tp] == 40
    assert c._read_offset[tp] == 15  # records from 15 are fetched again (at-least-once)
    _ack(c, 40, 41)
    c._acked[tp], c._acked_index[tp] = c._acked.pop("tp"), c._acked_index.pop("tp")
    assert handover._new_offset(c, tp) == 42


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
    from faust.types import TP

    tp, changelog = TP("t.rewarded", 0), TP("app-pending-changelog", 0)
    c = _consumer(None)
    c.app.topics.acks_enabled_for = lambda topic: topic == tp.topic
    asked = _seeking(c, {tp: None, changelog: None}, {tp: 0, changelog: 0})
    asyncio.run(handover._perform_seek(c))
    assert asked == [(tp,)]  # only the partitions whose offsets are committed
    assert c._committed_offset[tp] == 0
    assert c.seeks == [(tp, 0)]  # read again from there, whatever the fetcher had read
    assert c._read_offset[tp] is None  # the fetch starts where the consumer resets it
    c._acked[tp], c._acked_index[tp] = [1, 2], {1, 2}
    assert handover._new_offset(c, tp) is None
    c._acked[tp].append(0)
    c._acked_index[tp].add(0)
    assert handover._new_offset(c, tp) == 3


def test_a_partition_whose_log_starts_later_starts_its_run_there() -> None:
    from faust.types import TP

    tp = TP("t.rewarded", 1)
    c = _consumer(None)
    _seeking(c, {tp: None}, {tp: 7})  # retention deleted 0..6
    asyncio.run(handover._perform_seek(c))
    assert c.seeks == [(tp, 7)]
    c._acked[tp], c._acked_index[tp] = [7, 8], {7, 8}
    assert handover._new_offset(c, tp) == 9


def test_first_offsets_unknown_hold_the_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust's rule for an unknown committed offset (the run starts at the lowest offset
    acknowledged) passed records dropped below it: seen in a chaos run, where a commit made
    while the first offsets were asked for passed five records never handled."""
    from faust.types import TP

    monkeypatch.setattr(handover, "FIRST_OFFSET_RETRIES_S", (0, 0))
    tp = TP("t.rewarded", 2)
    c = _consumer(None)
    asked = _seeking(c, {tp: None}, OSError("broker gone"))
    asyncio.run(handover._perform_seek(c))  # does not raise
    assert len(asked) == 3  # tried again
    assert c._committed_offset[tp] is None
    assert c.seeks == []  # the fetcher's own position
    c._acked[tp], c._acked_index[tp] = [13, 14, 15], {13, 14, 15}
    assert handover._new_offset(c, tp) is None  # held: nothing says 0..12 were handled


def test_first_offsets_read_at_a_later_try() -> None:
    from faust.types import TP

    tp = TP("t.rewarded", 3)
    c = _consumer(None)
    asked = _seeking(c, {tp: None}, {tp: 0})
    answers = iter([OSError("not the leader yet"), None])
    ask = c.earliest_offsets

    async def earliest_offsets(*tps: Any) -> dict[Any, int]:
        error = next(answers)
        if error is not None:
            asked.append(tps)
            raise error
        return await ask(*tps)

    c.earliest_offsets = earliest_offsets
    asyncio.run(handover._perform_seek(c))
    assert len(asked) == 2
    assert c._committed_offset[tp] == 0 and c.seeks == [(tp, 0)]


def test_a_commit_while_the_first_offsets_are_asked_for_is_kept() -> None:
    """A committed offset set while the first offsets were on their way (a second seek beside
    this one) is not moved back to the partition's first offset."""
    from faust.types import TP

    tp = TP("t.rewarded", 0)
    c = _consumer(None)
    _seeking(c, {tp: None}, {tp: 0})
    ask = c.earliest_offsets

    async def earliest_offsets(*tps: Any) -> dict[Any, int]:
        c._committed_offset[tp] = 19
        return await ask(*tps)

    c.earliest_offsets = earliest_offsets
    asyncio.run(handover._perform_seek(c))
    assert c._committed_offset[tp] == 19
    assert c.seeks == []


def test_acknowledgements_before_the_seek_are_forgotten() -> None:
    """Faust's stream acknowledges an event it skips unhandled while a rebalance has the flow
    stopped; kept, that acknowledgement would fill the run the seek's re-reading builds."""
    from faust.types import TP

    tp = TP("t.agent-events", 0)
    c = _consumer(None)
    c._acked[tp], c._acked_index[tp] = [55], {55}  # skipped during the revoke, never handled
    _seeking(c, {tp: 50}, {})
    asyncio.run(handover._perform_seek(c))
    assert c._committed_offset[tp] == 50
    assert c._acked[tp] == [] and c._acked_index[tp] == set()
    _ack_tp(c, tp, *range(50, 55))  # read again from 50; 55 on its way, not handled yet
    assert handover._new_offset(c, tp) == 55
    c._committed_offset[tp] = 55  # committed (Faust sets it after the commit)
    _ack_tp(c, tp, 55)
    assert handover._new_offset(c, tp) == 56


def _ack_tp(c: Any, tp: Any, *offsets: int) -> None:
    for o in offsets:
        c._acked[tp].append(o)
        c._acked_index[tp].add(o)


def test_read_offsets_drop_no_record_of_an_input_topic() -> None:
    """After a seek back, a record fetched before it and delivered after it set the read offset
    past the records to read again, and Faust dropped those as read already: the partition's
    commit stayed at its head (seen in a chaos run: stalled at offset 0 until restarted)."""
    import faust

    handover.install()
    app = faust.App("read-offsets-test", broker="kafka://127.0.0.1:1")
    consumer = app.consumer
    assert isinstance(consumer._read_offset, handover.ReadOffsets)
    app.topics._acking_topics.add("read-offsets-in")  # as the conductor does at subscription
    from faust.types import TP

    tp, changelog = TP("read-offsets-in", 0), TP("read-offsets-changelog", 0)
    consumer._read_offset[tp] = 25  # a delivery from before the seek, after it
    consumer._read_offset[changelog] = 25
    read = consumer._read_offset.__getitem__  # how Faust's _drain_messages reads it
    assert read(tp) is None  # record 0, fetched again, is delivered
    assert read(changelog) == 25
    assert read(TP("read-offsets-changelog", 1)) is None


def test_a_partition_committed_or_known_is_not_asked_again() -> None:
    from faust.types import TP

    a, b = TP("t.rewarded", 0), TP("t.rewarded", 1)
    c = _consumer(None)
    c._committed_offset[b] = 4  # learnt by this worker (its own commit) since the assignment
    asked = _seeking(c, {a: 12, b: None}, {a: 0, b: 0})
    asyncio.run(handover._perform_seek(c))
    assert asked == []
    assert (c._committed_offset[a], c._committed_offset[b]) == (12, 4)
    assert c.seeks == [(b, 4)]  # the broker has no offset for it yet: read from this worker's
