"""A Faust table as a :class:`streams.core.store.Store`: how the live worker's stages (and the
span-resolution stage, :mod:`.spans_agent`) see their tables.

May import: the standard library, the core.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["TableStore"]


class TableStore:
    """A Faust table as a :class:`streams.core.store.Store`."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def get(self, key: bytes) -> bytes | None:
        value = self.table.get(key)
        return None if value is None else bytes(value)

    def set(self, key: bytes, value: bytes) -> None:
        self.table[key] = value

    def delete(self, key: bytes) -> None:
        if key in self.table:
            del self.table[key]

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.table.items()))
