"""The stored form of an open call: append-only Avro, read without decoding the events.

An open call is stored in the assembly table as a :class:`~streams.models.PendingEvents`
record whose last field is the array of events applied so far. Avro encodes an array as blocks
ending in a zero, so appending an event is: drop the final zero, add a one-item block, add the
zero again. Each new event costs the size of that event, not of the whole call, and nothing is
decoded or re-encoded. The array items carry the event's id, kind, seq, the END's step count and
size beside its bytes, so :func:`progress` reads what the assembly decides on with a reader
schema that skips the bytes (Avro schema resolution), and only a closing call decodes its
events (:func:`pending_call`).

May import: fastavro, :mod:`streams.codec`, :mod:`streams.models`, the core.
"""

from __future__ import annotations

import copy
import io
from datetime import datetime
from typing import Any

import fastavro
from fastavro.schema import parse_schema

from ..codec import MAGIC, SchemaRegistry
from ..errors import DecodeError
from ..models import AgentCall, CallPhase, Completion, PendingCall, PendingEvents
from .assembly import Applied, Progress, add_event, new_pending

__all__ = ["PendingCodec"]

_START, _END, _STEP = 0, 1, 2


class PendingCodec:
    """Encodes, appends to and reads the stored form of open calls."""

    def __init__(self, codec: SchemaRegistry):
        self.codec = codec
        self.schema = codec.schema_of(PendingEvents)
        self.header = MAGIC + codec.fingerprint_of(PendingEvents)
        item = next(f for f in self.schema["fields"] if f["name"] == "events")["type"]["items"]
        self.item_schema = parse_schema(_plain(item))
        light = _plain(self.schema)
        light_item = next(f for f in light["fields"] if f["name"] == "events")["type"]["items"]
        light_item["fields"] = [f for f in light_item["fields"] if f["name"] != "data"]
        self.light_schema = parse_schema(light)

    @staticmethod
    def item(event: AgentCall | Completion, data: bytes) -> dict[str, Any]:
        if isinstance(event, Completion):
            kind, seq, steps = _STEP, event.seq, -1
        elif event.phase is CallPhase.START:
            kind, seq, steps = _START, -1, -1
        else:
            kind, seq = _END, -1
            steps = -1 if event.step_count is None else event.step_count
        return {
            "event_id": event.event_id,
            "kind": kind,
            "seq": seq,
            "step_count": steps,
            "size": len(data),
            "data": data,
        }

    def new(
        self, call_id: str, partition: int, first_seen: datetime, item: dict[str, Any]
    ) -> bytes:
        buf = io.BytesIO()
        buf.write(self.header)
        fastavro.schemaless_writer(
            buf,
            self.schema,
            {
                "call_id": call_id,
                "partition": partition,
                "first_seen": first_seen,
                "events": [item],
            },
        )
        return buf.getvalue()

    def append(self, stored: bytes, item: dict[str, Any]) -> bytes:
        if not stored.endswith(b"\x00"):
            raise DecodeError("stored open call does not end with an Avro array terminator")
        buf = io.BytesIO()
        buf.write(b"\x02")  # a block of one item (zig-zag 1)
        fastavro.schemaless_writer(buf, self.item_schema, item)
        return stored[:-1] + buf.getvalue() + b"\x00"

    def progress(self, stored: bytes) -> Progress:
        """What has been applied, read without decoding the events themselves."""
        record = self._read(stored, self.light_schema)
        progress = Progress(record["call_id"], record["first_seen"], record["partition"])
        for item in record["events"]:
            progress.ids.add(item["event_id"])
            progress.bytes += item["size"]
            if item["kind"] == _STEP:
                progress.seqs.add(item["seq"])
            elif item["kind"] == _START:
                progress.has_start = True
            else:
                progress.has_end = True
                progress.expected_steps = None if item["step_count"] < 0 else item["step_count"]
        return progress

    def pending_call(self, stored: bytes) -> PendingCall:
        """Decode every event of a stored open call into the assembly's working view."""
        record = self._read(stored, self.schema)
        state = new_pending(record["call_id"], record["first_seen"])
        state.partition = record["partition"]
        for item in record["events"]:
            event = self.codec.decode(item["data"])
            assert isinstance(event, AgentCall | Completion)
            applied = add_event(state, event, item["size"])
            assert applied is Applied.ADDED, applied
        return state

    def _read(self, stored: bytes, reader: Any) -> dict[str, Any]:
        if not stored.startswith(self.header):
            raise DecodeError("not a stored open call (PendingEvents)")
        record = fastavro.schemaless_reader(
            io.BytesIO(stored[len(self.header) :]), self.schema, reader
        )
        assert isinstance(record, dict)
        return record


def _plain(schema: Any) -> Any:
    """A parsed schema without fastavro's private keys, to parse again."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return copy.copy(schema)
