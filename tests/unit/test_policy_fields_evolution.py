"""Schema evolution of the policy's fields (0.4): Completion gained ``policy_version``,
``fallback`` and ``error_type``, which the gateway sets (the version of the policy that
answered, why production answered a call routed to the policy, a step that broke after its
first bytes).

Both directions through the codec's writer-schema registration: today's reader resolves a record
written with the 0.3 Completion (the new fields take their defaults, null), and a 0.3 reader
resolves a record written today (the new fields are skipped). A fallback step is production's:
no id of it is ever a msg_id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastavro.schema import parse_schema, to_parsing_canonical_form

from streams.codec import SchemaRegistry, schema_dir
from streams.models import ChatMessage, Completion
from tests.unit.factories import T0

NEW = ("policy_version", "fallback", "error_type")


def completion_schema_03() -> dict[str, Any]:
    schema = json.loads((schema_dir() / "io.trajstream.Completion.avsc").read_text())
    schema["fields"] = [f for f in schema["fields"] if f["name"] not in NEW]
    return schema


def step(**fields: Any) -> Completion:
    values: dict[str, Any] = {
        "event_id": "c-1/1",
        "call_id": "c-1",
        "seq": 1,
        "event_time": T0,
        "response_id": "chatcmpl-1",
        "output_messages": [ChatMessage(role="assistant", content="an answer")],
        "upstream": "trinity",
        "policy_version": 7,
    }
    values.update(fields)
    return Completion(**values)


STEPS = [
    step(),
    step(upstream="production", response_id="prod-1", policy_version=None, fallback="timeout"),
    step(error_type="stream_broken"),
]


@pytest.mark.parametrize("written", STEPS)
def test_an_03_reader_reads_a_step_with_the_policy_fields(
    tmp_path: Path, written: Completion
) -> None:
    for path in schema_dir().glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "io.trajstream.Completion.avsc").write_text(json.dumps(completion_schema_03()))
    old = SchemaRegistry(tmp_path)
    old.register_writer(to_parsing_canonical_form(SchemaRegistry.default().schema_of(Completion)))
    name, record = old.decode_raw(SchemaRegistry.default().encode(written))
    assert name == "io.trajstream.Completion"
    assert not set(NEW) & set(record)
    assert (record["response_id"], record["upstream"]) == (written.response_id, written.upstream)


def test_todays_reader_reads_an_03_step_with_no_policy_fields() -> None:
    codec = SchemaRegistry()
    full = json.loads(to_parsing_canonical_form(SchemaRegistry.default().schema_of(Completion)))
    writer = {**full, "fields": [f for f in full["fields"] if f["name"] not in NEW]}
    codec.register_writer(writer)
    record = {k: v for k, v in step().to_avro().items() if k not in NEW}
    record["event_time"] = int(T0.timestamp() * 1000)  # the canonical form has no logical types
    read = codec.decode_as(codec.encode_with(parse_schema(writer), record), Completion)
    assert (read.policy_version, read.fallback, read.error_type) == (None, None, None)
    assert read.response_id == "chatcmpl-1" and read.msg_id == "chatcmpl-1"


@pytest.mark.parametrize("written", STEPS)
def test_a_step_with_the_policy_fields_round_trips(written: Completion) -> None:
    codec = SchemaRegistry.default()
    assert codec.decode(codec.encode(written)) == written


def test_a_fallback_step_has_no_msg_id() -> None:
    assert STEPS[1].msg_id is None  # production's answer: never sent to /feedback
    assert STEPS[0].msg_id == STEPS[2].msg_id == "chatcmpl-1"
