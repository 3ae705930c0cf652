"""The assemble stage over a batch of records: each store key written once per batch.

A runner that reads its input in batches (the live worker's ``assemble`` agent takes up to
``ASSEMBLE_BATCH`` records at once) opens :meth:`~streams.core.assemble.Assembler.batch`:
while it is open, the stage's stores (``pending`` and ``closed``) are :class:`WriteBehind`
stores that hold every write in memory, and reads see those writes. :meth:`Batch.flush` then
writes each key once, with its last value: a key written several times in the batch is one
write, and an entry written and deleted in the same batch (an open call's events when the whole
call arrives in one batch, the common case of a backlog) is never written at all. In the live
worker each write is one changelog record, so a 5-event call that opens and closes in one batch
costs its closed marker only, instead of four entries and four tombstones.

What the batch changes nothing of: what the stage decides (the same records, rejects and
stats, record by record, as without a batch), and when an input record counts as handled: the
runner flushes before it sends the batch's outputs and acknowledges its offsets only after
both, so an offset is committed only after the table writes and sends of its records.

Each held write remembers the partition of the record that made it (:meth:`Batch.at`), so that
a runner whose store routes writes by partition (a Faust table's changelog partition) writes it
where it would have without the batch.

May import: the standard library, the core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .store import Store

__all__ = ["Batch", "WriteBehind"]


class WriteBehind:
    """A :class:`~streams.core.store.Store` over another whose writes are held until
    :meth:`flush`; reads see them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.partition = -1
        """The partition of the record being handled: held with each write."""
        self._held: dict[bytes, tuple[int, bytes | None]] = {}

    def get(self, key: bytes) -> bytes | None:
        held = self._held.get(key)
        if held is not None:
            return held[1]
        return self.store.get(key)

    def set(self, key: bytes, value: bytes) -> None:
        self._held[key] = (self.partition, value)

    def delete(self, key: bytes) -> None:
        self._held[key] = (self.partition, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        held = self._held
        merged = [(k, v) for k, v in self.store.items() if k not in held]
        merged += [(k, v) for k, (_, v) in held.items() if v is not None]
        return iter(merged)

    def __len__(self) -> int:
        return len(self._held)

    def flush(self, at: Callable[[int], None] | None = None) -> int:
        """Write what is held to the store, each key once; returns the writes made. ``at`` is
        called with a write's partition before it is made. A delete of a key the store does not
        hold (written and deleted within the batch) is no write."""
        held, self._held = self._held, {}
        store = self.store
        writes = 0
        for key, (partition, value) in held.items():
            if value is None and store.get(key) is None:
                continue
            if at is not None:
                at(partition)
            if value is None:
                store.delete(key)
            else:
                store.set(key, value)
            writes += 1
        return writes


class Batch:
    """The write-behind stores of one batch of the assemble stage (see the module)."""

    def __init__(self, *stores: WriteBehind) -> None:
        self.stores = stores

    def at(self, partition: int) -> None:
        """The next records' writes are made for ``partition`` (the record's own)."""
        for store in self.stores:
            store.partition = partition

    def flush(self, at: Callable[[int], None] | None = None) -> int:
        """Write every store's held writes (see :meth:`WriteBehind.flush`); the writes made."""
        return sum(store.flush(at) for store in self.stores)
