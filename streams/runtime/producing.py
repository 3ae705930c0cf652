"""The worker's topics carry raw bytes (the codec's single-object encoding); with a schema
registry, :class:`FramingSchema` is the topic schema that rewrites each value into Confluent's
wire format on its way out (:class:`streams.wire.TopicFraming`: a header swap). Changelog
topics keep the single-object encoding. (The producer's own settings: idempotence and the
metadata it keeps, :mod:`streams.runtime.faust_patches.producer`.)

May import: faust, :mod:`streams.wire`.
"""

from __future__ import annotations

from typing import Any

import faust

from ..wire import TopicFraming

__all__ = ["FramingSchema", "raw_schema"]


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
    """The schema of one of the worker's raw topics."""
    if framing is None:
        return faust.Schema(
            key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
        )
    return FramingSchema(topic, framing)
