"""Faust tables as :class:`streams.core.store.Store`\\ s: how the live worker's stages see their
tables.

:class:`TableStore` writes through: every ``set`` and ``delete`` is a table write (one changelog
record). :class:`BatchedStore` keeps a batch's writes beside the table and writes only what
is left of them when the batch ends (:meth:`BatchedStore.flush`): an entry written and
deleted within one batch (an open call that closed in it) costs no changelog record at all, and
a key written twice costs one. What Kafka Streams' record cache does before a commit; here the
batch is one stream batch of the agent, flushed by the checkpoint (:mod:`.checkpoint`) after
the batch's records were acknowledged and before its offsets are.

May import: the standard library, the core, :mod:`streams.state_codec`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...core.store import Store
from ...state_codec import SEPARATOR

__all__ = ["BatchedStore", "TableStore"]


class TableStore:
    """A Faust table as a :class:`streams.core.store.Store`.

    Faust writes a key to the changelog partition of the record being handled. A store that
    writes outside of one (a batch's writes, :class:`BatchedStore`) says the partition first
    (:meth:`at`).

    Each write also records the key's partition where Faust's in-memory store keeps it
    (``_key_partition``), and a delete forgets it. That store drops, once a rebalance is
    recovered, the keys of partitions no longer assigned, but knows the partition only of the
    keys its recovery read from a changelog (faust-streaming 0.15.3): the keys a worker wrote
    itself stayed in its memory after their partition moved to another worker (its open calls
    counted twice by ``trajstream_open_calls``, its closed calls never forgotten, and an open
    call back from the dead if the partition returned after its tombstone was compacted away),
    and a restored key deleted later stayed in that record.

    With ``entries_follow_head`` (the open calls' table, whose entries
    ``call_key + SEPARATOR + n`` live and die with their call's key: :mod:`streams.core.pending`)
    only the call's own key is recorded: an entry follows its call's key out when a rebalance
    drops that one. The record costs a dict slot per key (30-60 B, by how full the dict is),
    which a call of ten events would pay ten times."""

    def __init__(self, table: Any, *, entries_follow_head: bool = False) -> None:
        self.table = table
        self._partition: int | None = None
        self._follow = entries_follow_head
        # the hook goes on at the first write: Faust makes the table's store when it is first
        # used, in its start (made here, at the worker's construction, the store's stop never
        # ended: seen in test_pipeline's graceful stop); until this store's first write, every
        # key the table holds was restored, and Faust recorded each one
        self._hooked = not entries_follow_head
        own = table.partition_for_key

        def partition_for_key(key: Any) -> int | None:
            return self._partition if self._partition is not None else own(key)

        table.partition_for_key = partition_for_key

    def at(self, partition: int | None) -> None:
        """Write to changelog ``partition`` from now on (None: the current record's)."""
        self._partition = partition

    def get(self, key: bytes) -> bytes | None:
        value = self.table.get(key)
        return None if value is None else bytes(value)

    def set(self, key: bytes, value: bytes) -> None:
        self.table[key] = value
        if not self._hooked:
            self._hooked = True
            _drop_entries_with_their_head(self.table)
        owners = self._owners()
        if owners is not None and not (self._follow and SEPARATOR in key):
            owners[key] = self.table.partition_for_key(key)

    def delete(self, key: bytes) -> None:
        if key in self.table:
            del self.table[key]
        owners = self._owners()
        if owners is not None:
            owners.pop(key, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.table.items()))

    def _owners(self) -> dict[bytes, int | None] | None:
        """Faust's in-memory store's partition of each key (None for another kind of store)."""
        return getattr(getattr(self.table, "data", None), "_key_partition", None)


def _drop_entries_with_their_head(table: Any) -> None:
    """After Faust's in-memory store has dropped the keys of the partitions a rebalance took
    away, drop too the entries (``head + SEPARATOR + suffix``) whose head key is gone: those
    :class:`TableStore` wrote without recording their partition. Runs only when the drop took
    something (a pass over the keys); another kind of store is left alone."""
    store = getattr(table, "data", None)
    own = getattr(store, "on_recovery_completed", None)
    if own is None or not hasattr(store, "_key_partition"):
        return

    async def on_recovery_completed(active_tps: Any, standby_tps: Any) -> None:
        data = store.data
        held = len(data)
        await own(active_tps, standby_tps)
        if len(data) == held:
            return
        orphans = [
            key for key in data if SEPARATOR in key and key[: key.index(SEPARATOR)] not in data
        ]
        owners = store._key_partition
        for key in orphans:
            del data[key]
            owners.pop(key, None)

    store.on_recovery_completed = on_recovery_completed


class BatchedStore:
    """A store whose writes wait for the end of the batch (see the module), over a
    :class:`TableStore` (or any :class:`~streams.core.store.Store`).

    The runner says which partition the record being handled belongs to (:attr:`partition`)
    before handing it to the stage; each write remembers it, and :meth:`flush` writes each key's
    last value to that partition (:meth:`TableStore.at`: Faust would take it from the current
    event, which a batch does not have). Reads see the batch's writes first. :meth:`discard`
    forgets them (a batch that failed, to be read again)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.partition = 0
        self._writes: dict[bytes, tuple[int, bytes | None]] = {}

    def get(self, key: bytes) -> bytes | None:
        write = self._writes.get(key)
        if write is not None:
            return write[1]
        return self.inner.get(key)

    def set(self, key: bytes, value: bytes) -> None:
        self._writes[key] = (self.partition, value)

    def delete(self, key: bytes) -> None:
        # a key the store does not hold is only forgotten at the flush (no write then)
        self._writes[key] = (self.partition, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        writes = self._writes
        merged = [(k, v) for k, v in self.inner.items() if k not in writes]
        merged.extend((k, v) for k, (_, v) in writes.items() if v is not None)
        return iter(merged)

    def __len__(self) -> int:
        """The writes waiting."""
        return len(self._writes)

    def flush(self) -> None:
        """Write what the batch left to the store (a table: and its changelog)."""
        inner, writes = self.inner, self._writes
        at = getattr(inner, "at", None)
        try:
            for key, (partition, value) in writes.items():
                if at is not None:
                    at(partition)
                if value is not None:
                    inner.set(key, value)
                else:
                    inner.delete(key)
        finally:
            if at is not None:
                at(None)
            writes.clear()

    def discard(self) -> None:
        """Forget the batch's writes."""
        self._writes.clear()
