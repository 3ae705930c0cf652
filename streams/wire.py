"""The two byte layouts of a record on Kafka, and turning one into the other.

* **Avro single-object encoding** (the Avro specification; what trajstream wrote before it knew
  registries, and still writes without one): ``C3 01``, the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema, the Avro body.
* **Confluent's wire format** (what Kafka Connect, ksqlDB, Flink and the Confluent serializers
  read and write): ``00``, the 4-byte big-endian schema id the registry gave the writer schema,
  the Avro body. When the schema registered for a topic is a union (a topic that carries several
  record types: one subject per topic, see :mod:`streams.io.registry`), the body is the union's
  encoding: the branch's index as a zig-zag varint, then the record's own body.

Both carry the same record body, so a writer turns a single-object record into the wire format
by swapping the header (:meth:`TopicFraming.reframe`, no re-encoding), and the codec reads
either (:mod:`streams.codec`). Pure: no I/O.

May import: the standard library, :mod:`streams.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import DecodeError

__all__ = [
    "CONFLUENT_HEADER",
    "CONFLUENT_MAGIC",
    "SINGLE_OBJECT_HEADER",
    "SINGLE_OBJECT_MAGIC",
    "TopicFraming",
    "confluent_prefix",
    "is_confluent",
    "is_single_object",
    "read_confluent",
    "read_varint",
    "zigzag",
]

log = logging.getLogger(__name__)

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
SINGLE_OBJECT_HEADER = len(SINGLE_OBJECT_MAGIC) + 8
CONFLUENT_MAGIC = b"\x00"
CONFLUENT_HEADER = len(CONFLUENT_MAGIC) + 4


def is_single_object(data: bytes) -> bool:
    return len(data) >= SINGLE_OBJECT_HEADER and data[:2] == SINGLE_OBJECT_MAGIC


def is_confluent(data: bytes) -> bool:
    return len(data) >= CONFLUENT_HEADER and data[:1] == CONFLUENT_MAGIC


def zigzag(n: int) -> bytes:
    """``n`` as Avro writes an int or long: zig-zag, then a little-endian base-128 varint."""
    value = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes, offset: int) -> tuple[int, int]:
    """The zig-zag varint at ``offset`` and the offset after it."""
    shift = result = 0
    while True:
        if offset >= len(data) or shift > 63:
            raise DecodeError("corrupt record: a union index that does not end")
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), offset
        shift += 7


def read_confluent(data: bytes) -> int:
    """The schema id of a record in Confluent's wire format."""
    if not is_confluent(data):
        raise DecodeError("not a record in Confluent's wire format (magic byte 0, schema id)")
    return int.from_bytes(data[1:CONFLUENT_HEADER], "big")


def confluent_prefix(schema_id: int, branch: int | None = None) -> bytes:
    """What precedes a record's body in the wire format: magic, schema id, and for a union
    schema the record's branch index."""
    prefix = CONFLUENT_MAGIC + schema_id.to_bytes(4, "big")
    return prefix if branch is None else prefix + zigzag(branch)


@dataclass(frozen=True)
class TopicFraming:
    """What the writers of one process put in front of each record body, per topic and writer
    schema fingerprint (built from the registry's answers by :mod:`streams.io.registry`).

    A topic it does not name (a table's changelog, a topic this process does not register)
    keeps the single-object encoding; so does a record type its subject's schema does not
    hold (it is logged once: readers read it either way).
    """

    prefixes: Mapping[str, Mapping[bytes, bytes]]

    def reframe(self, topic: str, data: bytes) -> bytes:
        """``data`` (single-object) in the wire format of ``topic``'s subject."""
        by_fingerprint = self.prefixes.get(topic)
        if by_fingerprint is None or not is_single_object(data):
            return data
        prefix = by_fingerprint.get(bytes(data[2:SINGLE_OBJECT_HEADER]))
        if prefix is None:
            _warn_once(topic, bytes(data[2:SINGLE_OBJECT_HEADER]))
            return data
        return prefix + bytes(data[SINGLE_OBJECT_HEADER:])


_WARNED: set[tuple[str, bytes]] = set()


def _warn_once(topic: str, fingerprint: bytes) -> None:
    if (topic, fingerprint) not in _WARNED:
        _WARNED.add((topic, fingerprint))
        log.warning(
            "a record type that %s's registered schema does not hold (fingerprint %s): "
            "written in single-object encoding",
            topic,
            fingerprint.hex(),
        )
