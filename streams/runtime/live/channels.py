"""How the live worker's agents read and write Kafka records: raw bytes both ways.

In: every agent reads its topics as raw bytes (:func:`raw_input`) and the runner opens each
record once at its edge (:class:`streams.envelope.Edge`, in :mod:`.guard`; :func:`source_of` is
the core's view of a Faust event), so a record that cannot be read is a dead letter, not a crash
in Faust's deserializer. Out: the worker's topics carry the codec's single-object encoding; with
a schema registry, :class:`FramingSchema` is the topic schema that rewrites each value into
Confluent's wire format on its way out (:class:`streams.wire.TopicFraming`: a header swap).
Changelog topics keep the single-object encoding. (The producer's own settings, idempotence and
the metadata it keeps: :mod:`streams.runtime.faust_patches.producer`.)

A record on ``<p>.trajectories`` or ``<p>.rewarded`` that the stage which made it already took
through the next stage carries the :data:`HANDLED` header (:func:`handled`): an output for
readers, which the next stage passes over (:mod:`.assembling`).

May import: faust, :mod:`streams.envelope`, :mod:`streams.wire`.
"""

from __future__ import annotations

from typing import Any

import faust

from ...envelope import Source
from ...wire import TopicFraming

__all__ = [
    "HANDLED",
    "HANDLED_HEADERS",
    "FramingSchema",
    "handled",
    "raw_input",
    "raw_schema",
    "source_of",
]

HANDLED = "trajstream-handled"
"""The header of a record on ``<p>.trajectories`` or ``<p>.rewarded`` that the stage which made
it already took through the next stage (rewarded, or fed back): an output for readers, not a hop
for the worker (:mod:`.assembling`)."""
HANDLED_HEADERS = [(HANDLED, b"1")]


def raw_input(app: faust.App, *topics: str) -> faust.TopicT:
    """An agent's input topics as raw bytes: the runner opens them at its edge
    (:class:`streams.envelope.Edge`; a record that cannot be read is a dead letter, not a crash
    in Faust's deserializer)."""
    return app.topic(
        *topics, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def source_of(event: Any) -> Source:
    """The core's view of a Faust event."""
    msg = event.message
    return Source.read(msg.topic, msg.partition, msg.offset, msg.key, msg.value)


def handled(event: Any) -> bool:
    """Whether a record read carries the :data:`HANDLED` header: the stage that made it handled
    it for this one already."""
    headers = getattr(event.message, "headers", None) or ()
    if isinstance(headers, dict):
        headers = headers.items()
    return any(name == HANDLED for name, _ in headers)


class FramingSchema(faust.Schema[bytes, bytes]):
    """Raw bytes in and out; on the way out, ``framing`` puts ``topic``'s wire format on."""

    def __init__(self, topic: str, framing: TopicFraming) -> None:
        super().__init__(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
        self.topic = topic
        self.framing = framing

    def dumps_value(
        self, app: Any, value: Any, *, serializer: Any = None, headers: Any
    ) -> tuple[Any, Any]:
        payload, headers = super().dumps_value(app, value, serializer=serializer, headers=headers)
        if isinstance(payload, bytes | bytearray):
            payload = self.framing.reframe(self.topic, bytes(payload))
        return payload, headers


def raw_schema(topic: str, framing: TopicFraming | None) -> faust.Schema[bytes, bytes]:
    """The schema of one of the worker's raw topics (its output topics)."""
    if framing is None:
        return faust.Schema(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
    return FramingSchema(topic, framing)
