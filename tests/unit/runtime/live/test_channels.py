"""How the worker's agents read and write records (streams/runtime/live/channels.py): the core's
view of a Faust event, the HANDLED header however Faust hands headers over, and each output
topic's wire format."""

from __future__ import annotations

import faust

from streams.codec import SchemaRegistry
from streams.models import Tick
from streams.runtime.live.channels import (
    HANDLED_HEADERS,
    FramingSchema,
    handled,
    raw_schema,
    source_of,
)
from streams.wire import SINGLE_OBJECT_HEADER, TopicFraming
from tests.unit.factories import at

from .memory import Event


def test_a_faust_event_as_the_core_reads_it() -> None:
    src = source_of(Event("t.agent-events", 12, b"c1", b"v", partition=3))
    assert (src.topic, src.partition, src.offset, src.key, src.value) == (
        "t.agent-events",
        3,
        12,
        b"c1",
        b"v",
    )


def test_the_handled_header_in_a_list_or_a_dict() -> None:
    assert handled(Event("t", 0, b"k", b"v", headers=HANDLED_HEADERS))
    assert handled(Event("t", 0, b"k", b"v", headers=dict(HANDLED_HEADERS)))
    assert not handled(Event("t", 0, b"k", b"v", headers=[("other", b"1")]))
    assert not handled(Event("t", 0, b"k", b"v"))


def test_an_output_topic_writes_its_subjects_wire_format() -> None:
    value = SchemaRegistry.default().encode(Tick(at=at(0)))
    fingerprint = value[2:SINGLE_OBJECT_HEADER]
    framing = TopicFraming({"t.ticks": {fingerprint: b"\x00\x00\x00\x00\x07"}})
    schema = raw_schema("t.ticks", framing)
    assert isinstance(schema, FramingSchema)
    app = faust.App("t-framing", broker="kafka://127.0.0.1:9")
    payload, _ = schema.dumps_value(app, value, headers={})
    assert payload == b"\x00\x00\x00\x00\x07" + value[SINGLE_OBJECT_HEADER:]
    assert not isinstance(raw_schema("t.ticks", None), FramingSchema)  # bytes as they are
