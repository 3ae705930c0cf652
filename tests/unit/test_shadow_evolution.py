"""Schema evolution of shadow answers (0.3): Completion gained ``shadow_response_id``,
``shadow_output_messages``, ``shadow_tool_call_details`` and ``shadow_latency_ms``.

Both directions through the codec's writer-schema registration: today's reader resolves a record
written with the 0.2 Completion (the new fields take their defaults), and a 0.2 reader resolves a
record written today (the new fields are skipped). Also: which ids are Trinity's msg_ids, and
the selection a routed START carries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fastavro.schema import parse_schema, to_parsing_canonical_form

from streams.codec import SchemaRegistry, schema_dir
from streams.core.select import routed_selection
from streams.models import (
    AgentCall,
    CallPhase,
    ChatMessage,
    Completion,
    Selection,
    StepKind,
    ToolCall,
    Trajectory,
)
from tests.unit.factories import T0

NEW = ("shadow_response_id", "shadow_output_messages", "shadow_tool_call_details",
       "shadow_latency_ms")  # fmt: skip


def completion_schema_02() -> dict[str, Any]:
    schema = json.loads((schema_dir() / "io.trajstream.Completion.avsc").read_text())
    schema["fields"] = [f for f in schema["fields"] if f["name"] not in NEW]
    return schema


def shadowed_step(seq: int = 1, **fields: Any) -> Completion:
    calls = [ToolCall(id="call_t", name="lookup", arguments="{}")]
    values: dict[str, Any] = {
        "event_id": f"c-1/{seq}",
        "call_id": "c-1",
        "seq": seq,
        "event_time": T0,
        "response_id": f"prod-{seq}",
        "output_messages": [ChatMessage(role="assistant", content="production's answer")],
        "upstream": "production",
        "shadow_response_id": f"trinity-{seq}",
        "shadow_output_messages": [ChatMessage(role="assistant", content="", tool_calls=calls)],
        "shadow_tool_call_details": calls,
        "shadow_latency_ms": 12.5,
    }
    values.update(fields)
    return Completion(**values)


def test_an_02_reader_reads_a_shadowed_step(tmp_path: Path) -> None:
    for path in schema_dir().glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "io.trajstream.Completion.avsc").write_text(json.dumps(completion_schema_02()))
    old = SchemaRegistry(tmp_path)
    old.register_writer(to_parsing_canonical_form(SchemaRegistry.default().schema_of(Completion)))
    name, record = old.decode_raw(SchemaRegistry.default().encode(shadowed_step()))
    assert name == "io.trajstream.Completion"
    assert not set(NEW) & set(record)
    assert record["response_id"] == "prod-1" and record["upstream"] == "production"


def test_todays_reader_reads_an_02_step() -> None:
    codec = SchemaRegistry()
    writer = completion_schema_02()
    full = json.loads(to_parsing_canonical_form(SchemaRegistry.default().schema_of(Completion)))
    writer_full = {**full, "fields": [f for f in full["fields"] if f["name"] not in NEW]}
    codec.register_writer(writer_full)
    record = {k: v for k, v in shadowed_step().to_avro().items() if k not in NEW}
    record["event_time"] = int(T0.timestamp() * 1000)  # the canonical form has no logical types
    step = codec.decode_as(codec.encode_with(parse_schema(writer_full), record), Completion)
    assert step.response_id == "prod-1" and step.shadow_response_id is None
    assert step.shadow_output_messages == [] and step.shadow_tool_call_details == []
    assert step.shadow_latency_ms is None
    assert len(writer["fields"]) == len(full["fields"]) - len(NEW)


def test_a_shadowed_step_round_trips() -> None:
    codec = SchemaRegistry.default()
    assert codec.decode(codec.encode(shadowed_step())) == shadowed_step()


def test_msg_ids_are_trinitys_never_an_id_production_issued() -> None:
    steps = [
        shadowed_step(1),  # shadowed: Trinity's id
        shadowed_step(2, shadow_response_id=None),  # the shadow failed: production's id only
        shadowed_step(3, upstream="trinity", shadow_response_id=None, response_id="trinity-3"),
        shadowed_step(4, upstream=None, shadow_response_id=None, response_id="sdk-4"),  # no gateway
        shadowed_step(5, kind=StepKind.TOOL, upstream=None, shadow_response_id=None),
    ]
    trajectory = Trajectory(
        trajectory_id="c-1",
        call_id="c-1",
        task_id="t",
        steps=steps,
        selection=Selection(selected=True, strategy="s", reason="r"),
        ended_at=T0,
    )
    assert trajectory.msg_ids == ["trinity-1", "trinity-3", "sdk-4"]


def test_a_routed_start_carries_the_selection_and_others_do_not() -> None:
    def start(**attributes: str) -> AgentCall:
        return AgentCall(
            event_id="c/start",
            call_id="c",
            phase=CallPhase.START,
            event_time=T0,
            attributes=attributes,
        )

    assert routed_selection(None) is None
    assert routed_selection(start()) is None
    assert routed_selection(start(**{"trajstream.route.selected": "maybe"})) is None
    routed = start(
        **{
            "trajstream.route.selected": "false",
            "trajstream.route.strategy": "marked(ttl=60s)",
            "trajstream.route.reason": "unmarked",
        }
    )
    assert routed_selection(routed) == Selection(
        selected=False, strategy="marked(ttl=60s)", reason="unmarked"
    )
