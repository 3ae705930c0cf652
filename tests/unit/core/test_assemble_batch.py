"""The assemble stage over batches (streams.core.assemble_batch): the same decisions as record
by record, each store key written at most once per batch, a call that opens and closes within
one batch never written to ``pending``, and every write made for its record's partition."""

from __future__ import annotations

import random
from typing import Any

import pytest

from streams.core.assemble_batch import WriteBehind
from streams.core.effects import Out, Source
from streams.core.pending import entry_key
from streams.core.store import MemoryStore
from tests.unit.core.harness import CODEC, Core
from tests.unit.core.test_pending import CountingStore, calls, outcome
from tests.unit.factories import at, end, start, step


def counted_core() -> Core:
    core = Core()
    core.pending, core.closed = CountingStore(), CountingStore()
    core.assembler.pending = core.pending
    core.assembler.closed = core.closed
    return core


def batched(
    events: list[Any], sizes: list[int], *, partition_of: Any = None, restart: bool = False
) -> tuple[Core, list[int]]:
    """Run ``events`` through the assembler in batches of the given sizes (cycled); returns the
    core and the partitions its writes were made for."""
    core = counted_core()
    written: list[int] = []
    i = 0
    n = 0
    while i < len(events):
        size = sizes[n % len(sizes)]
        n += 1
        if restart:
            core.assembler.reset()
        with core.assembler.batch(at=written.append) as batch:
            for event in events[i : i + size]:
                partition = partition_of(event) if partition_of else 0
                batch.at(partition)
                core._offset += 1
                src = Source(
                    "agent-events",
                    partition,
                    core._offset,
                    event.call_id.encode(),
                    CODEC.encode(event),
                )
                core._through(core.assembler.on_record(src, at(i / 100)), at(i / 100))
                i += 1
    return core, written


def one_by_one(events: list[Any]) -> Core:
    core = counted_core()
    for i, event in enumerate(events):
        core.event(event, at(i / 100))
    return core


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("sizes", [[1], [2, 5], [7], [500]], ids=["1", "2-5", "7", "all"])
@pytest.mark.parametrize("restart", [False, True], ids=["kept", "restart-per-batch"])
def test_batches_decide_what_records_one_by_one_decide(
    seed: int, sizes: list[int], restart: bool
) -> None:
    events = calls(random.Random(seed), 40)
    expected = one_by_one(events)
    core, _ = batched(events, sizes, restart=restart)
    assert outcome(core) == outcome(expected)
    assert len(outcome(core)[0]) == 40
    assert core.pending.data == expected.pending.data == {}
    assert core.closed.data == expected.closed.data


@pytest.mark.parametrize("seed", [1, 2])
def test_each_key_is_written_at_most_once_per_batch(seed: int) -> None:
    events = calls(random.Random(seed), 40)
    core = counted_core()
    for i in range(0, len(events), 9):
        before = len(core.pending.writes)
        with core.assembler.batch() as batch:
            for j, event in enumerate(events[i : i + 9]):
                batch.at(0)
                core.event(event, at((i + j) / 100))
        keys = [k for k, _ in core.pending.writes[before:]]
        assert len(keys) == len(set(keys))
    # and never more than record by record
    assert len(core.pending.writes) <= len(one_by_one(events).pending.writes)


def test_a_call_within_one_batch_writes_no_pending_entry_and_one_closed_marker() -> None:
    events = [start(), *(step(seq=s) for s in range(3)), end(step_count=3)]
    core, _ = batched(events, [len(events)])
    assert core.pending.writes == []
    assert [k for k, _ in core.closed.writes] == [b"call-1"]
    assert [d.closed_reason for d in core.topic("decisions")] == ["ended"]
    (trajectory,) = core.topic("trajectories")
    assert [s.seq for s in trajectory.steps] == [0, 1, 2]


def test_a_call_across_two_batches_writes_its_first_batchs_entries_once_then_deletes() -> None:
    events = [start(), step(seq=0), step(seq=1), end(step_count=2)]
    core, _ = batched(events, [2, 2])
    assert core.pending.writes == [
        (entry_key(b"call-1", 0), core.pending.writes[0][1]),
        (entry_key(b"call-1", 1), core.pending.writes[1][1]),
        (entry_key(b"call-1", 0), None),
        (entry_key(b"call-1", 1), None),
    ]
    assert core.pending.data == {}
    assert [d.closed_reason for d in core.topic("decisions")] == ["ended"]


def test_every_write_is_made_for_the_partition_of_the_record_that_made_it() -> None:
    events = [start("a"), start("b"), step("a", seq=0), step("b", seq=0), end("a", step_count=1)]
    partitions = {"a": 3, "b": 5}
    core, written = batched(events, [len(events)], partition_of=lambda e: partitions[e.call_id])
    # b stays open: its two entries (partition 5); a closed: its marker (partition 3)
    assert sorted(written) == [3, 5, 5]
    assert sorted(core.pending.data) == [entry_key(b"b", 0), entry_key(b"b", 1)]
    assert list(core.closed.data) == [b"a"]


def test_the_held_writes_are_made_when_the_block_raises() -> None:
    core = counted_core()
    with pytest.raises(RuntimeError), core.assembler.batch() as batch:
        batch.at(0)
        core.event(start(), at(0))
        raise RuntimeError("after the record")
    assert list(core.pending.data) == [b"call-1"]
    # and the stage reads its own stores again
    assert core.assembler.pending is core.pending
    core.event(end(step_count=0), at(1))
    assert [d.closed_reason for d in core.topic("decisions")] == ["ended"]


def test_a_tick_in_a_batch_sees_the_calls_the_batch_opened() -> None:
    core = counted_core()
    with core.assembler.batch() as batch:
        batch.at(0)
        core.event(start(), at(0))
        out: Out = core.assembler.on_tick(0, at(61))
    assert [d.closed_reason for d in out.records("decisions")] == ["abandoned: no end event"]
    assert core.pending.writes == []
    assert list(core.closed.data) == [b"call-1"]


def test_write_behind_reads_its_writes_and_lists_the_merged_items() -> None:
    base = MemoryStore()
    base.set(b"a", b"1")
    base.set(b"b", b"2")
    store = WriteBehind(base)
    store.set(b"c", b"3")
    store.delete(b"a")
    store.set(b"b", b"4")
    assert store.get(b"a") is None and store.get(b"b") == b"4" and store.get(b"c") == b"3"
    assert sorted(store.items()) == [(b"b", b"4"), (b"c", b"3")]
    assert base.data == {b"a": b"1", b"b": b"2"}
    store.delete(b"new")
    assert store.flush() == 3  # the delete of a key never stored is no write
    assert base.data == {b"b": b"4", b"c": b"3"}
    assert store.flush() == 0
