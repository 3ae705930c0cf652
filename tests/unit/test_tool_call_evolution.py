"""Schema evolution of structured tool calls (0.2): ChatMessage gained ``tool_calls`` and
``tool_call_id``, Completion gained ``tool_call_details``, ``tool_call_id`` and ``upstream``.

Both directions, through the codec's writer-schema registration: a reader of today resolves a
record written with the 0.1 schemas (new fields take their defaults), and a reader that still has
the 0.1 schemas resolves a record written today (new fields are skipped).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fastavro.schema import parse_schema, to_parsing_canonical_form

from streams.codec import SchemaRegistry, schema_dir
from streams.models import MODELS, ChatMessage, Completion, StepKind, ToolCall
from tests.unit.factories import T0

OLD_CHAT_MESSAGE: dict[str, Any] = {
    "type": "record",
    "name": "ChatMessage",
    "namespace": "io.trajstream",
    "fields": [
        {"name": "role", "type": "string"},
        {"name": "content", "type": "string", "default": ""},
        {"name": "name", "type": ["null", "string"], "default": None},
    ],
}
OLD_COMPLETION: dict[str, Any] = json.loads(
    '{"type": "record", "name": "Completion", "namespace": "io.trajstream", "fields": ['
    '{"name": "event_id", "type": "string"}, {"name": "call_id", "type": "string"},'
    '{"name": "seq", "type": "int"},'
    '{"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},'
    '{"name": "kind", "type": "io.trajstream.StepKind", "default": "LLM"},'
    '{"name": "operation_name", "type": "string", "default": "chat"},'
    '{"name": "provider_name", "type": ["null", "string"], "default": null},'
    '{"name": "request_model", "type": ["null", "string"], "default": null},'
    '{"name": "response_model", "type": ["null", "string"], "default": null},'
    '{"name": "response_id", "type": ["null", "string"], "default": null},'
    '{"name": "finish_reasons", "type": {"type": "array", "items": "string"}, "default": []},'
    '{"name": "input_tokens", "type": ["null", "long"], "default": null},'
    '{"name": "output_tokens", "type": ["null", "long"], "default": null},'
    '{"name": "input_messages", "type": {"type": "array", "items": "io.trajstream.ChatMessage"},'
    ' "default": []},'
    '{"name": "output_messages", "type": {"type": "array", "items": "io.trajstream.ChatMessage"},'
    ' "default": []},'
    '{"name": "tool_name", "type": ["null", "string"], "default": null},'
    '{"name": "tool_calls", "type": {"type": "array", "items": "string"}, "default": []},'
    '{"name": "latency_ms", "type": ["null", "double"], "default": null}]}'
)
OLD_FIELDS = [f["name"] for f in OLD_COMPLETION["fields"]]


def old_registry(tmp_path: Path) -> SchemaRegistry:
    """What a 0.1 reader holds: the schema directory with the 0.1 ChatMessage and Completion."""
    for path in schema_dir().glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "io.trajstream.ToolCall.avsc").unlink()
    (tmp_path / "io.trajstream.ChatMessage.avsc").write_text(json.dumps(OLD_CHAT_MESSAGE))
    (tmp_path / "io.trajstream.Completion.avsc").write_text(json.dumps(OLD_COMPLETION))
    return SchemaRegistry(tmp_path, models=[m for m in MODELS if m is not ToolCall])


def new_step() -> Completion:
    calls = [ToolCall(id="call_a", name="lookup", arguments='{"order": 42}')]
    return Completion(
        event_id="e-1",
        call_id="c-1",
        seq=2,
        event_time=T0,
        input_messages=[ChatMessage(role="user", content="where is order 42?")],
        output_messages=[ChatMessage(role="assistant", content="", tool_calls=calls)],
        tool_calls=["lookup"],
        tool_call_details=calls,
        upstream="trinity",
    )


def test_old_reader_reads_a_new_record(tmp_path: Path) -> None:
    old = old_registry(tmp_path)
    # a newer producer's schema comes self-contained (its canonical form)
    new_schema = SchemaRegistry.default().schema_of(Completion)
    old.register_writer(to_parsing_canonical_form(new_schema))
    name, record = old.decode_raw(SchemaRegistry.default().encode(new_step()))
    assert name == "io.trajstream.Completion"
    assert list(record) == OLD_FIELDS
    assert record["tool_calls"] == ["lookup"]
    assert record["output_messages"] == [{"role": "assistant", "content": "", "name": None}]


def test_new_reader_reads_an_old_record() -> None:
    codec = SchemaRegistry()
    old_writer = json.loads(json.dumps(OLD_COMPLETION))
    # the 0.1 producer's schema, self-contained: its ChatMessage is the 0.1 one
    for field in old_writer["fields"]:
        if field["name"] == "input_messages":
            field["type"]["items"] = OLD_CHAT_MESSAGE
        if field["name"] == "kind":
            field["type"] = {"type": "enum", "name": "StepKind", "symbols": ["LLM", "TOOL"]}
    fp = codec.register_writer(old_writer)
    parsed = parse_schema(old_writer)
    old = {k: v for k, v in new_step().to_avro().items() if k in OLD_FIELDS}
    old["input_messages"] = [{"role": "tool", "content": "shipped", "name": "lookup"}]
    old["output_messages"] = [{"role": "assistant", "content": "It shipped.", "name": None}]
    data = codec.encode_with(parsed, old)
    assert data[2:10] == fp
    step = codec.decode_as(data, Completion)
    assert step.kind is StepKind.LLM
    assert step.tool_call_details == [] and step.tool_call_id is None and step.upstream is None
    assert step.input_messages[0].tool_call_id is None
    assert step.output_messages[0].tool_calls == []
    assert step.output_messages[0].content == "It shipped."


def test_new_record_round_trips_its_tool_calls() -> None:
    codec = SchemaRegistry.default()
    assert codec.decode(codec.encode(new_step())) == new_step()
