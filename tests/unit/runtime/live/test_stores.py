"""Faust tables as the core's stores (streams/runtime/live/stores.py): a batch's writes wait
beside the table and only what is left of them is written, each to the partition of the record
that made it; keys written by this worker leave with their partition at a rebalance."""

from __future__ import annotations

from typing import Any

from streams.runtime.live.stores import BatchedStore, TableStore

from .memory import Recording


def test_a_batch_writes_only_what_it_leaves() -> None:
    inner = Recording()
    inner.set(b"old", b"1")
    inner.writes.clear()
    store = BatchedStore(inner)
    store.set(b"a", b"1")
    store.set(b"a", b"2")  # written twice: one write
    store.set(b"b", b"1")
    store.delete(b"b")  # written and deleted in the batch: no write at all
    store.delete(b"old")  # held before the batch: deleted
    store.delete(b"never")  # never held: nothing
    assert store.get(b"a") == b"2" and store.get(b"b") is None and store.get(b"old") is None
    assert sorted(store.items()) == [(b"a", b"2")]
    assert inner.writes == [] and len(store) == 4
    store.flush()
    assert sorted(inner.writes) == [("delete", b"old"), ("set", b"a")]
    assert dict(inner.items()) == {b"a": b"2"} and len(store) == 0
    store.set(b"c", b"1")
    store.discard()
    assert store.get(b"c") is None and dict(inner.items()) == {b"a": b"2"}


class FakeTable(dict):  # type: ignore[type-arg]
    """A Faust table's surface: writes go to the partition ``partition_for_key`` names."""

    def __init__(self) -> None:
        super().__init__()
        self.changelog: list[tuple[int | None, bytes, bytes | None]] = []

    def partition_for_key(self, key: Any) -> int | None:
        return None  # Faust: the current event's partition (there is none in a batch)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.changelog.append((self.partition_for_key(key), key, value))
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self.changelog.append((self.partition_for_key(key), key, None))
        super().__delitem__(key)


def test_each_write_goes_to_the_partition_of_the_record_that_made_it() -> None:
    table = FakeTable()
    store = BatchedStore(TableStore(table))
    store.partition = 3
    store.set(b"x", b"1")
    store.partition = 1
    store.set(b"y", b"1")
    store.flush()
    assert table.changelog == [(3, b"x", b"1"), (1, b"y", b"1")]
    table[b"z"] = b"1"  # outside a flush: Faust's own rule again
    assert table.changelog[-1] == (None, b"z", b"1")


class MemoryTable(dict):  # type: ignore[type-arg]
    """A Faust table over Faust's own in-memory store (``data``), written as Faust's table
    writes it; ``partition_for_key`` is the partition of the record being handled."""

    def __init__(self) -> None:
        import faust

        super().__init__()
        app = faust.App("t-own-keys", broker="kafka://127.0.0.1:9")
        self.data = app.Table("pending", partitions=4, key_type=bytes, value_type=bytes).data
        self.current = 0

    def partition_for_key(self, key: Any) -> int | None:
        return self.current

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def __delitem__(self, key: bytes) -> None:
        del self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data


async def test_keys_written_here_are_forgotten_when_their_partition_moves_away() -> None:
    from faust.types import TP

    table = MemoryTable()
    store = TableStore(table)
    for partition, key in ((0, b"a"), (1, b"b"), (2, b"c")):
        table.current = partition
        store.set(key, b"1")
    batched = BatchedStore(store)
    batched.partition = 3
    batched.set(b"d", b"1")
    batched.flush()
    table.data._key_partition[b"restored"] = 1  # as Faust's recovery records a key it read
    table.data[b"restored"] = b"1"
    store.delete(b"restored")  # deleted since: not remembered either
    assert table.data._key_partition == {b"a": 0, b"b": 1, b"c": 2, b"d": 3}
    # a rebalance leaves this worker partitions 1 and 3 of the table's changelog
    changelog = "t-own-keys-pending-changelog"
    await table.data.on_recovery_completed({TP(changelog, 1), TP(changelog, 3)}, set())
    assert dict(table.data.data) == {b"b": b"1", b"d": b"1"}


async def test_an_open_calls_entries_leave_with_its_key_without_a_record_of_their_own() -> None:
    from faust.types import TP

    from streams.state_codec import entry_key

    table = MemoryTable()
    store = TableStore(table, entries_follow_head=True)
    for partition, call in ((0, b"a"), (1, b"b")):
        table.current = partition
        for n in range(3):
            store.set(entry_key(call, n), b"1")
    # a restored call: Faust records each key its recovery read, entries too
    for n in range(2):
        table.data[entry_key(b"r", n)] = b"1"
        table.data._key_partition[entry_key(b"r", n)] = 0
    assert table.data._key_partition == {b"a": 0, b"b": 1, b"r": 0, entry_key(b"r", 1): 0}
    changelog = "t-own-keys-pending-changelog"
    await table.data.on_recovery_completed({TP(changelog, 1)}, set())
    assert sorted(table.data.data) == [b"b", entry_key(b"b", 1), entry_key(b"b", 2)]
    assert table.data._key_partition == {b"b": 1}
    # nothing dropped: nothing else touched
    await table.data.on_recovery_completed({TP(changelog, 1)}, set())
    assert len(table.data.data) == 3
