"""The byte layout of the stages' stored state, beside the wire codec (:mod:`streams.codec`).

The stages of :mod:`streams.core` keep their state in stores of bytes (a Faust table's
changelog in the live worker, a dict in replay and tests: :mod:`streams.core.store`). What
those bytes and keys are is decided here, and only here:

- **values**: a state record (``ClosedCall``, ``AwaitingReward``, ``StoredVerdict``,
  ``LedgerState``, ``TraceHead``, a held ``TraceSpan`` or agent END) in the Avro single-object
  encoding of the wire codec (:meth:`StateCodec.dump`, :meth:`StateCodec.load`), so both
  runners read and write one format and a changelog is readable with the schemas;
- **open calls** (the ``pending`` store, :mod:`streams.core.pending`): one
  :class:`~streams.models.OpenCallEvent` entry per applied event, the first under the call's
  key, the n-th (n = 1, 2, ...) under ``call_id + 0xFF + n`` in decimal (:func:`entry_key`;
  0xFF never occurs in UTF-8, so no call's keys meet another's). :class:`OpenCallLayout` writes
  an entry and reads it whole or without its event bytes ("light", to count progress without
  decoding events); the layout of older versions, one ``PendingEvents`` value per call, is still
  read (:class:`LegacyLayout`);
- **traces** (the ``traces`` store, :mod:`streams.core.spans`): the trace's head under
  ``trace_id``, each held record under ``trace_id + 0xFF + span_id`` (:func:`held_key`).

A store that lives and dies with one process and that nothing reads as bytes (replay's
:class:`~streams.core.store.MemoryStore`) keeps the state records themselves instead:
:class:`ObjectState` is the same interface without the encoding (no re-encoding in replay; the
keys are the same). A stage treats what it loads as its working copy and writes back every change,
as it must with bytes, so both forms hold the same state.

May import: fastavro, :mod:`streams.codec`, :mod:`streams.models`, :mod:`streams.errors`.
"""

from __future__ import annotations

import copy
import io
from datetime import UTC, datetime
from typing import Any, TypeVar

import fastavro
from fastavro.schema import parse_schema

from .codec import MAGIC, SchemaRegistry
from .errors import DecodeError
from .models import AvroModel, OpenCallEvent, PendingEvents

__all__ = [
    "SEPARATOR",
    "LegacyLayout",
    "ObjectOpenCallLayout",
    "ObjectState",
    "OpenCallLayout",
    "StateCodec",
    "entry_key",
    "held_key",
    "is_head_key",
]

M = TypeVar("M", bound=AvroModel)

SEPARATOR = b"\xff"
"""Between a key and an entry's suffix: never in UTF-8, so no call's or trace's keys meet."""


def entry_key(call_key: bytes, index: int) -> bytes:
    """The store key of an open call's ``index``-th entry (the first is the call's own key)."""
    return call_key if index == 0 else call_key + SEPARATOR + str(index).encode()


def is_head_key(key: bytes) -> bool:
    """Whether ``key`` is a call's (or a trace's) own key, not one of its entries."""
    return SEPARATOR not in key


def held_key(trace_key: bytes, span_id: str) -> bytes:
    """The store key of a record a trace holds for span ``span_id``."""
    return trace_key + SEPARATOR + span_id.encode()


class StateCodec:
    """Stored state records as bytes: the single-object encoding of the wire codec."""

    reads_legacy = True
    """Whether stores in this form may hold older versions' open calls (:class:`LegacyLayout`)."""

    def __init__(self, codec: SchemaRegistry) -> None:
        self.codec = codec

    def dump(self, record: AvroModel) -> Any:
        return self.codec.encode(record)

    def load(self, raw: Any, model: type[M]) -> M:
        return self.codec.decode_as(raw, model)

    def open_calls(self) -> OpenCallLayout:
        """The layout of the open calls' entries in this form."""
        return OpenCallLayout(self.codec)


class ObjectState(StateCodec):
    """State records kept as themselves, for a store nothing reads as bytes (see the module)."""

    reads_legacy = False

    def dump(self, record: AvroModel) -> Any:
        return record

    def load(self, raw: Any, model: type[M]) -> M:
        if not isinstance(raw, model):
            raise DecodeError(f"expected a stored {model.__name__}, got {type(raw).__name__}")
        return raw

    def open_calls(self) -> OpenCallLayout:
        return ObjectOpenCallLayout(self.codec)


class OpenCallLayout:
    """One stored entry of an open call (an :class:`~streams.models.OpenCallEvent`), written and
    read as a plain dict: ``event_id``, ``kind`` (0 START, 1 END, 2 step), ``seq``,
    ``step_count``, ``size``, ``data`` (the event's bytes as read), and on a call's first entry
    ``call_id``, ``partition``, ``first_seen``."""

    START, END, STEP = 0, 1, 2

    def __init__(self, codec: SchemaRegistry) -> None:
        self.codec = codec
        self.schema = codec.schema_of(OpenCallEvent)
        self.header = MAGIC + codec.fingerprint_of(OpenCallEvent)
        light = _plain(self.schema)
        light["fields"] = [f for f in light["fields"] if f["name"] != "data"]
        self.light_schema = parse_schema(light)

    @staticmethod
    def defaults() -> dict[str, Any]:
        """The fields only a call's first entry fills."""
        return {"call_id": "", "partition": -1, "first_seen": None}

    def write(self, item: dict[str, Any]) -> bytes:
        """The entry's bytes: the same as fastavro writes them (a unit test holds the two
        together), written by hand because one is written per event (about four times
        faster)."""
        first_seen = item["first_seen"]
        try:
            if first_seen is None:
                when = b"\x00"
            elif first_seen.tzinfo is not None:
                delta = first_seen - _EPOCH
                millis = (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000
                when = b"\x02" + _long(millis)
            else:
                return self._fastavro(item)  # a naive time: fastavro's rule (local time)
            call_id = item["call_id"].encode()
            event_id = item["event_id"].encode()
            data = item["data"]
            return b"".join(
                (
                    self.header,
                    _long(len(call_id)),
                    call_id,
                    _long(item["partition"]),
                    when,
                    _long(len(event_id)),
                    event_id,
                    _long(item["kind"]),
                    _long(item["seq"]),
                    _long(item["step_count"]),
                    _long(item["size"]),
                    _long(len(data)),
                    data,
                )
            )
        except (AttributeError, TypeError):  # not the types the schema says: fastavro decides
            return self._fastavro(item)

    def _fastavro(self, item: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(self.header)
        fastavro.schemaless_writer(buf, self.schema, item)
        return buf.getvalue()

    def light(self, raw: bytes) -> dict[str, Any]:
        """An entry without its event's bytes (cheaper: the progress needs only the rest)."""
        return self._read(raw, self.light_schema)

    def full(self, raw: bytes) -> dict[str, Any]:
        return self._read(raw, self.schema)

    def _read(self, raw: bytes, reader: Any) -> dict[str, Any]:
        if not raw.startswith(self.header):
            raise DecodeError("not a stored open call's event (OpenCallEvent)")
        record = fastavro.schemaless_reader(
            io.BytesIO(raw[len(self.header) :]), self.schema, reader
        )
        assert isinstance(record, dict)
        return record


class ObjectOpenCallLayout(OpenCallLayout):
    """An open call's entry kept as the plain dict :class:`OpenCallLayout` would encode."""

    def write(self, item: dict[str, Any]) -> Any:
        return item

    def light(self, raw: Any) -> dict[str, Any]:
        return self._read(raw, None)

    def full(self, raw: Any) -> dict[str, Any]:
        return self._read(raw, None)

    def _read(self, raw: Any, reader: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise DecodeError("not a stored open call's event (OpenCallEvent)")
        return raw


class LegacyLayout:
    """Reads the stored form of older versions: one PendingEvents value per open call."""

    def __init__(self, codec: SchemaRegistry) -> None:
        self.codec = codec
        self.schema = codec.schema_of(PendingEvents)
        self.header = MAGIC + codec.fingerprint_of(PendingEvents)

    def holds(self, raw: bytes) -> bool:
        return raw.startswith(self.header)

    def read(self, raw: bytes) -> dict[str, Any]:
        record = fastavro.schemaless_reader(io.BytesIO(raw[len(self.header) :]), self.schema)
        assert isinstance(record, dict)
        return record


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _long(n: int) -> bytes:
    """An Avro int or long: zig-zag, then a little-endian base-128 varint."""
    if not isinstance(n, int) or isinstance(n, bool) or not -(1 << 63) <= n < 1 << 63:
        raise TypeError(f"not an Avro long: {n!r}")
    n = (n << 1) ^ (n >> 63)
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]


def _plain(schema: Any) -> Any:
    """A parsed schema without fastavro's private keys, to parse again."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return copy.copy(schema)
