"""The state-store protocol of the core's stages, and its in-memory backend.

A stage keeps its state in stores keyed by bytes with Avro-encoded bytes as values: a Faust
table in the live worker (see :mod:`streams.runtime.live`), a :class:`MemoryStore` in replay
and in tests. The values are the same bytes in both, so both runners read and write one format;
the keys and values (the byte layout) are :mod:`streams.state_codec`'s.

May import: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

__all__ = ["MemoryStore", "Store"]


class Store(Protocol):
    """Get, set and delete by key, and iterate (to rebuild deadline indexes)."""

    def get(self, key: bytes) -> bytes | None: ...

    def set(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None:
        """Remove ``key``; a key that is not there is no error."""
        ...

    def items(self) -> Iterable[tuple[bytes, bytes]]: ...


class MemoryStore:
    """A dict as a :class:`Store`."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def set(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.data.items()))

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, key: object) -> bool:
        return key in self.data
