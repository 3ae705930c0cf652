"""Server-sent events, both ways: a parser that takes bytes as they arrive, and an encoder.

Both APIs translated here stream typed events (``event: <type>`` then ``data: <JSON>``);
OpenAI's chat completions stream ``data:`` lines only and end with ``data: [DONE]``.

May import: the standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "HoldLast", "SseParser", "encode_event"]


@dataclass(frozen=True, slots=True)
class Event:
    """One server-sent event: its ``event:`` name (empty when none) and its ``data:``."""

    name: str
    data: str

    def json(self) -> Any:
        """The data as JSON (None when it is not JSON, e.g. ``[DONE]``)."""
        try:
            return json.loads(self.data)
        except ValueError:
            return None


class SseParser:
    """Feed bytes as they arrive; iterate the complete events they hold."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> Iterator[Event]:
        self._buffer += data.replace(b"\r\n", b"\n")
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            name, lines = "", []
            for line in raw.decode("utf-8", "replace").split("\n"):
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    lines.append(line[5:].removeprefix(" "))
            if lines:
                yield Event(name, "\n".join(lines))


_END = re.compile(rb"\r?\n\r?\n")


class HoldLast:
    """Passes a stream's bytes on, but for its last whole event: held back until
    :meth:`release` (``gateway.durability = acked``: the terminal event, ``response.completed``
    or ``message_stop``, is sent once the step is on the broker)."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        """What may be sent now: everything up to the start of the last whole event."""
        self._held += data
        ends = [m.end() for m in _END.finditer(self._held)]
        if len(ends) < 2:
            return b""
        out, self._held = self._held[: ends[-2]], self._held[ends[-2] :]
        return out

    def release(self) -> bytes:
        held, self._held = self._held, b""
        return held


def encode_event(data: dict[str, Any], *, name: str | None = None) -> bytes:
    """One event: ``event: <name>`` (``data["type"]`` unless given) and its JSON data."""
    kind = name if name is not None else str(data.get("type", ""))
    head = f"event: {kind}\n" if kind else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
