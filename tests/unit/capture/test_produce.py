"""Unit tests of streams.capture.produce: JSON lines validated before anything is published."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from streams.capture.produce import LineError, parse_lines, read_events
from streams.models import (
    AgentCall,
    CallPhase,
    CallStatus,
    Completion,
    FeedbackKind,
    StepKind,
    UserFeedback,
)
from tests.unit.factories import T0, at


def line(obj: Any) -> str:
    return json.dumps(obj)


START: dict[str, Any] = {
    "type": "agent_call",
    "event_id": "e1",
    "call_id": "c1",
    "phase": "START",
    "event_time": "2026-01-01T00:00:00Z",
    "agent_name": "researcher",
    "input_messages": [{"role": "user", "content": "hi"}],
    "mark": {"marked_at": "2026-01-01T00:00:00Z", "task_id": "t-1", "labels": ["gold"]},
}
STEP = {
    "type": "completion",
    "event_id": "e2",
    "call_id": "c1",
    "seq": 0,
    "kind": "TOOL",
    "event_time": "2026-01-01T01:00:01+01:00",
    "tool_name": "search",
    "latency_ms": 12.5,
}
END = {
    "type": "agent_call",
    "event_id": "e3",
    "call_id": "c1",
    "phase": "END",
    "event_time": "2026-01-01T00:00:03.5Z",
    "status": "OK",
    "output": "Paris.",
    "step_count": 1,
}
FEEDBACK = {
    "type": "user_feedback",
    "event_id": "e4",
    "call_id": "c1",
    "kind": "RATING",
    "rating": 9,
    "rating_min": 0,
    "rating_max": 10,
    "event_time": "2026-01-01T00:00:10Z",
}


def test_valid_lines_of_each_type() -> None:
    parsed = parse_lines([line(START), line(STEP), line(END), line(FEEDBACK)])
    assert parsed.errors == []
    start, step, end, feedback = parsed.events
    assert isinstance(start, AgentCall) and start.phase is CallPhase.START
    assert start.mark is not None and start.mark.task_id == "t-1"
    assert start.input_messages[0].content == "hi"
    assert isinstance(step, Completion) and step.kind is StepKind.TOOL
    assert step.event_time == at(1)  # +01:00 normalised to UTC
    assert isinstance(end, AgentCall) and end.status is CallStatus.OK
    assert end.event_time == at(3.5)
    assert isinstance(feedback, UserFeedback) and feedback.kind is FeedbackKind.RATING
    assert (feedback.rating, feedback.rating_max) == (9.0, 10.0)
    assert start.event_time == T0


def test_minimal_lines_use_the_defaults() -> None:
    parsed = parse_lines(
        [
            '{"type": "completion", "event_id": "e", "call_id": "c", "seq": 3, '
            '"event_time": "2026-01-01T00:00:00Z"}'
        ]
    )
    [step] = parsed.events
    assert isinstance(step, Completion)
    assert (step.kind, step.operation_name, step.tool_calls) == (StepKind.LLM, "chat", [])


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not JSON: Expecting value at column 1"),
        ('{"type": "agent_call", ', "not JSON: Expecting property name enclosed in double quotes"),
        ("[1, 2]", "not a JSON object"),
        ('"agent_call"', "not a JSON object"),
        ("null", "not a JSON object"),
        (
            line({**START, "type": "span"}),
            "type must be one of agent_call, completion, user_feedback, got 'span'",
        ),
        (line({k: v for k, v in START.items() if k != "type"}), "type must be one of .*got None"),
        (line({**START, "type": 5}), "got 5"),
        (
            line({k: v for k, v in START.items() if k != "call_id"}),
            "invalid agent_call: call_id: Field required",
        ),
        (
            line({k: v for k, v in STEP.items() if k != "seq"}),
            "invalid completion: seq: Field required",
        ),
        (
            line({**STEP, "event_time": "2026-01-01T00:00:01"}),
            "invalid completion: event_time: Value error, timestamp has no timezone",
        ),
        (
            line({**START, "mark": {**START["mark"], "marked_at": "2026-01-01T00:00:00"}}),
            "invalid agent_call: mark.marked_at: Value error, timestamp has no timezone",
        ),
        (
            line({**END, "phase": "MIDDLE"}),
            "invalid agent_call: phase: Input should be 'START' or 'END'",
        ),
        (
            line({**END, "colour": "blue"}),
            "invalid agent_call: colour: Extra inputs are not permitted",
        ),
        (
            line({**FEEDBACK, "rating": "NaN"}),
            "invalid user_feedback: rating: Value error, rating must",
        ),
        (
            line({**END, "call_id": ""}),
            "invalid agent_call: call_id: String should have at least 1",
        ),
    ],
    ids=[
        "not-json",
        "cut-json",
        "array",
        "string",
        "null",
        "unknown-type",
        "no-type",
        "type-not-string",
        "missing-call-id",
        "missing-seq",
        "naive-timestamp",
        "naive-nested-timestamp",
        "bad-enum",
        "extra-field",
        "nan-rating",
        "empty-call-id",
    ],
)
def test_invalid_lines_carry_the_line_number_and_reason(text: str, reason: str) -> None:
    parsed = parse_lines([line(START), text, line(END)])
    assert [type(e) for e in parsed.events] == [AgentCall, AgentCall]
    [error] = parsed.errors
    assert error.line == 2
    assert re.search(reason, error.reason), error.reason
    assert str(error) == f"line 2: {error.reason}"


def test_every_invalid_line_is_reported_with_its_physical_line_number() -> None:
    lines = [
        line(START),
        "",
        "   \t",
        "oops",
        line(STEP),
        "\n",
        "[]",
        line({**END, "event_time": "2026-01-01T00:00:03"}),
        line(FEEDBACK),
    ]
    parsed = parse_lines(lines)
    assert [e.line for e in parsed.errors] == [4, 7, 8]
    assert [type(e) for e in parsed.events] == [AgentCall, Completion, UserFeedback]


def test_blank_lines_are_skipped() -> None:
    parsed = parse_lines(["", "\n", "  \n", "\t\r\n"])
    assert parsed.events == [] and parsed.errors == []


def test_several_problems_in_one_line_are_summarised() -> None:
    parsed = parse_lines([line({"type": "completion"})])
    [error] = parsed.errors
    for field in ("event_id", "call_id", "seq", "event_time"):
        assert f"{field}: Field required" in error.reason


def test_read_events_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        "\n".join([line(START), "", line(STEP), "{bad", line(END)]) + "\n", encoding="utf-8"
    )
    parsed = read_events(path)
    assert [e.event_id for e in parsed.events] == ["e1", "e2", "e3"]
    assert parsed.errors == [LineError(4, parsed.errors[0].reason)]
    assert parsed.errors[0].reason.startswith("not JSON")


def test_a_line_that_is_not_utf8_is_reported_with_its_number(tmp_path) -> None:
    from streams.capture.produce import read_events

    good = (
        b'{"type": "agent_call", "event_id": "e1", "call_id": "c1", "phase": "START", '
        b'"event_time": "2026-01-31T12:00:00Z"}\n'
    )
    bad = b'{"type": "agent_call", "x": "caf\xe9"}\n'
    path = tmp_path / "events.jsonl"
    path.write_bytes(good + bad + good.replace(b"e1", b"e2"))
    parsed = read_events(path)
    assert [str(e) for e in parsed.errors] == ["line 2: not UTF-8: byte 0xe9 at column 33"]
    assert [e.event_id for e in parsed.events] == ["e1", "e2"]


def test_input_files_are_the_files_and_the_jsonl_files_of_directories(tmp_path) -> None:
    from streams.capture.produce import input_files
    from streams.errors import ConfigError

    d = tmp_path / "captured"
    d.mkdir()
    for name in ("b.jsonl", "a.jsonl", "notes.txt"):
        (d / name).write_text("", encoding="utf-8")
    single = tmp_path / "one.json"
    single.write_text("", encoding="utf-8")
    assert input_files([d, single]) == [d / "a.jsonl", d / "b.jsonl", single]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no \.jsonl file"):
        input_files([tmp_path / "empty"])
    with pytest.raises(ConfigError, match="does not exist"):
        input_files([tmp_path / "missing.jsonl"])
