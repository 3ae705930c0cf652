"""Unit tests of streams.models: the models match the .avsc contract and enforce its rules."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from typing import Any

import pydantic
import pytest
from pydantic_core import PydanticUndefined

from streams.codec import SchemaRegistry, schema_dir
from streams.models import (
    MODELS,
    AgentCall,
    AvroModel,
    CallPhase,
    CallStatus,
    FeedbackKind,
    LedgerState,
    StepKind,
    Tick,
    UserFeedback,
    WindowAccumulator,
    utcnow,
)
from tests.unit.factories import T0, end, feedback, mark, rewarded, step, trajectory


def avsc(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((schema_dir() / f"{name}.avsc").read_text())
    return loaded


# -- the contract -----------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_field_names_equal_the_schema_field_names(model: type[AvroModel]) -> None:
    schema = avsc(model.avro_name)
    assert f"{schema['namespace']}.{schema['name']}" == model.avro_name
    assert list(model.model_fields) == [f["name"] for f in schema["fields"]]


def test_window_accumulator_matches_the_record_nested_in_ledger_state() -> None:
    windows = next(f for f in avsc(LedgerState.avro_name)["fields"] if f["name"] == "windows")
    nested = windows["type"]["items"]
    assert f"io.trajstream.{nested['name']}" == WindowAccumulator.avro_name
    assert list(WindowAccumulator.model_fields) == [f["name"] for f in nested["fields"]]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_schema_defaults_are_the_model_defaults(model: type[AvroModel]) -> None:
    for field in avsc(model.avro_name)["fields"]:
        default = model.model_fields[field["name"]].get_default(call_default_factory=True)
        if "default" in field:
            assert default == field["default"], field["name"]
        else:
            assert default is PydanticUndefined, f"{field['name']} is required in the schema"


@pytest.mark.parametrize(
    "enum", [CallPhase, CallStatus, StepKind, FeedbackKind], ids=lambda e: e.__name__
)
def test_enum_symbols_equal_the_schema_symbols(enum: type[StrEnum]) -> None:
    assert [e.value for e in enum] == avsc(f"io.trajstream.{enum.__name__}")["symbols"]


def test_every_schema_file_has_a_model_or_enum() -> None:
    known = {m.avro_name for m in MODELS} | {
        f"io.trajstream.{e.__name__}" for e in (CallPhase, CallStatus, StepKind, FeedbackKind)
    }
    assert {p.stem for p in schema_dir().glob("*.avsc")} == known


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="extra"):
        AgentCall.model_validate(end().model_dump() | {"tenant": "acme"})


# -- timestamps ------------------------------------------------------------------------------

NAIVE = datetime(2026, 1, 1, 12, 0)  # noqa: DTZ001 - the point of the test


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda t: end(event_time=t), "event_time"),
        (lambda t: step(event_time=t), "event_time"),
        (lambda t: feedback(event_time=t), "event_time"),
        (lambda t: mark(marked_at=t), "marked_at"),
        (lambda t: Tick(at=t), "at"),
        (lambda t: trajectory(ended_at=t), "ended_at"),
        (lambda t: trajectory(started_at=t), "started_at"),
        (lambda t: rewarded(event_time=t), "event_time"),
        (lambda t: LedgerState(watermark=t), "watermark"),
    ],
    ids=[
        "AgentCall",
        "Completion",
        "UserFeedback",
        "TrainingMark",
        "Tick",
        "Trajectory.ended_at",
        "Trajectory.started_at",
        "RewardedTrajectory",
        "LedgerState.watermark",
    ],
)
@pytest.mark.parametrize("naive", [NAIVE, "2026-01-01T12:00:00"], ids=["datetime", "iso-string"])
def test_naive_datetimes_are_refused(build: Any, field: str, naive: Any) -> None:
    with pytest.raises(pydantic.ValidationError, match=f"{field}[\\s\\S]*no timezone"):
        build(naive)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (
            datetime(2026, 1, 1, 0, 0, 0, 123999, tzinfo=UTC),
            datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC),
        ),
        (datetime(2026, 1, 1, 0, 0, 0, 999, tzinfo=UTC), T0),
        (datetime(2026, 1, 1, 2, 0, tzinfo=timezone(timedelta(hours=2))), T0),
        (
            datetime(2025, 12, 31, 19, 0, 0, 500500, tzinfo=timezone(timedelta(hours=-5))),
            datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=UTC),
        ),
        ("2026-01-01T00:00:00.1239Z", datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)),
        ("2026-01-01T01:00:00+01:00", T0),
        (1767225600, T0),  # epoch seconds are UTC by definition
    ],
    ids=["truncated-not-rounded", "sub-ms", "plus-2h", "minus-5h", "iso-Z", "iso-offset", "epoch"],
)
def test_timestamps_are_utc_truncated_to_milliseconds(given: Any, expected: datetime) -> None:
    got = Tick(at=given).at
    assert got == expected
    assert got.tzinfo is UTC


def test_utcnow_is_utc_at_millisecond_precision() -> None:
    now = utcnow()
    assert now.tzinfo is UTC
    assert now.microsecond % 1000 == 0


# -- field rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda task_id: mark(task_id=task_id),
        lambda task_id: trajectory(task_id=task_id),
        lambda task_id: rewarded(task_id=task_id),
    ],
    ids=["TrainingMark", "Trajectory", "RewardedTrajectory"],
)
def test_task_id_is_one_to_64_characters(build: Any) -> None:
    assert build("t" * 64).task_id == "t" * 64
    with pytest.raises(pydantic.ValidationError, match="at most 64 characters"):
        build("t" * 65)
    with pytest.raises(pydantic.ValidationError, match="at least 1 character"):
        build("")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_reward_is_refused(value: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="reward must be a finite number"):
        rewarded(reward=value)


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_rating_is_refused(value: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="rating must be a finite number"):
        feedback(rating=value)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: end(call_id=""), "call_id"),
        (lambda: end(event_id=""), "event_id"),
        (lambda: end(step_count=-1), "step_count"),
        (lambda: step(seq=-1), "seq"),
        (lambda: step(seq=2**31), "seq"),
        (lambda: step(input_tokens=-1), "input_tokens"),
        (lambda: step(latency_ms=-0.5), "latency_ms"),
        (lambda: mark(run_id=-1), "run_id"),
        (lambda: trajectory(trajectory_id=""), "trajectory_id"),
        (lambda: UserFeedback(event_id="e", call_id="c", event_time=T0, kind="STARS"), "kind"),  # type: ignore[arg-type]
        (lambda: AgentCall(event_id="e", call_id="c", phase="MIDDLE", event_time=T0), "phase"),  # type: ignore[arg-type]
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_field_rules(build: Any, field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        build()


def test_msg_ids_are_llm_response_ids_in_step_order() -> None:
    steps = [
        step(seq=0, response_id="r0"),
        step(seq=1, kind=StepKind.TOOL, response_id="tool-has-no-msg-id"),
        step(seq=2, response_id=None),
        step(seq=3, response_id=""),
        step(seq=4, response_id="r4"),
    ]
    assert trajectory(steps=steps).msg_ids == ["r0", "r4"]


def test_enums_are_parsed_from_their_symbols() -> None:
    call = AgentCall.model_validate(
        {
            "event_id": "e",
            "call_id": "c",
            "phase": "END",
            "event_time": "2026-01-01T00:00:00Z",
            "status": "ERROR",
        }
    )
    assert call.phase is CallPhase.END
    assert call.status is CallStatus.ERROR


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: end(step_count=2**31), "step_count"),
        (lambda: step(input_tokens=2**63), "input_tokens"),
        (lambda: step(output_tokens=2**63), "output_tokens"),
        (lambda: mark(run_id=2**63), "run_id"),
    ],
    ids=[
        "AgentCall.step_count",
        "Completion.input_tokens",
        "Completion.output_tokens",
        "TrainingMark.run_id",
    ],
)
def test_integers_the_model_accepts_fit_the_avro_type(build: Any, field: str) -> None:
    try:
        record = build()
    except pydantic.ValidationError:
        return  # refused by the model: fine
    SchemaRegistry.default().encode(record)  # accepted: must then be encodable


# -- ratings on their scale (issue 14) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("rating", "lo", "hi", "reason"),
    [
        (9.0, 1.0, 5.0, "rating 9.0 is outside its scale 1.0..5.0"),
        (0.0, 1.0, 5.0, "outside its scale"),
        (3.0, 5.0, 5.0, "rating_min < rating_max"),
        (None, 5.0, 5.0, "rating_min < rating_max"),
        (None, 5.0, 1.0, "rating_min < rating_max"),
    ],
)
def test_a_rating_off_its_scale_is_invalid(
    rating: float | None, lo: float, hi: float, reason: str
) -> None:
    from streams.models import FeedbackKind, UserFeedback, utcnow

    with pytest.raises(pydantic.ValidationError, match=reason):
        UserFeedback(
            event_id="e", call_id="c", event_time=utcnow(), kind=FeedbackKind.RATING,
            rating=rating, rating_min=lo, rating_max=hi,
        )


def test_a_rating_off_its_scale_is_a_dead_letter_reason_at_decode() -> None:
    """Published by another client, the record decodes but fails validation: the reward stage
    turns that ValidationError into a dead letter with this reason."""
    import fastavro  # noqa: F401 - the codec's dependency

    from streams.codec import SchemaRegistry
    from streams.errors import ValidationError
    from streams.models import FeedbackKind, UserFeedback, utcnow

    codec = SchemaRegistry.default()
    ok = UserFeedback(
        event_id="e", call_id="c", event_time=utcnow(), kind=FeedbackKind.RATING, rating=5.0
    )
    forged = ok.model_copy(update={"rating": 9.0})  # bypasses validation, like a foreign producer
    with pytest.raises(ValidationError, match="outside its scale"):
        codec.decode(codec.encode(forged))
