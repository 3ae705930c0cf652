"""Schema evolution of reasoning (0.3): ChatMessage gained ``reasoning``, the model's reasoning
before an assistant message (Responses API reasoning items, Anthropic thinking blocks, a chat
completion's ``reasoning_content``).

Both directions through the codec's writer-schema registration: a reader of today resolves a
Completion written before the field (``reasoning`` is None), and a reader without the field
resolves a Completion written today (the field is skipped, the rest is read).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fastavro.schema import to_parsing_canonical_form

from streams.codec import SchemaRegistry, schema_dir
from streams.models import ChatMessage, Completion, ToolCall
from tests.unit.factories import T0


def registry_without_reasoning(tmp_path: Path) -> SchemaRegistry:
    for path in schema_dir().glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    chat = json.loads((tmp_path / "io.trajstream.ChatMessage.avsc").read_text())
    chat["fields"] = [f for f in chat["fields"] if f["name"] != "reasoning"]
    (tmp_path / "io.trajstream.ChatMessage.avsc").write_text(json.dumps(chat))
    return SchemaRegistry(tmp_path)


def step(reasoning: str | None) -> Completion:
    call = ToolCall(id="call_1", name="lookup", arguments='{"order": 42}')
    return Completion(
        event_id="e-1",
        call_id="c-1",
        seq=1,
        event_time=T0,
        input_messages=[ChatMessage(role="user", content="where is 42?")],
        output_messages=[
            ChatMessage(role="assistant", content="", tool_calls=[call], reasoning=reasoning)
        ],
    )


def test_a_reader_without_the_field_reads_a_record_with_reasoning(tmp_path: Path) -> None:
    old = registry_without_reasoning(tmp_path)
    old.register_writer(to_parsing_canonical_form(SchemaRegistry.default().schema_of(Completion)))
    name, record = old.decode_raw(SchemaRegistry.default().encode(step("look it up first")))
    assert name == "io.trajstream.Completion"
    (message,) = record["output_messages"]
    assert "reasoning" not in message and message["tool_calls"][0]["name"] == "lookup"


def test_a_reader_of_today_reads_a_record_written_before_the_field(tmp_path: Path) -> None:
    old = registry_without_reasoning(tmp_path)
    new = SchemaRegistry.default()
    new.register_writer(to_parsing_canonical_form(old.schema_of(Completion)))
    again = new.decode_as(old.encode(step(None)), Completion)
    assert again == step(None) and again.output_messages[0].reasoning is None


def test_reasoning_round_trips() -> None:
    codec = SchemaRegistry.default()
    assert codec.decode(codec.encode(step("look it up first"))) == step("look it up first")
