"""Unit tests of streams.rewards: the built-ins, Composite, Rewarder and loading by name."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from streams import rewards
from streams.core.rewards import (
    Composite,
    Rewarder,
    RewardResult,
    answer_length,
    latency_efficiency,
    load_reward,
    tool_calls,
    user_rating,
)
from streams.errors import ConfigError, RewardError
from streams.models import CallStatus, FeedbackKind, StepKind, Trajectory
from tests.unit.factories import T0, feedback, mark, step, trajectory


def constant(value: float) -> Any:
    def fn(_: Trajectory) -> float:
        return value

    return fn


def always_zero(_: Trajectory) -> float:
    """A plugin reward, loaded as ``tests.unit.core.test_rewards:always_zero``."""
    return 0.0


def success(_: Trajectory) -> float:
    """A plugin whose short name collides with ``streams.rewards:success``."""
    return 0.0


always_zero.reward_version = "7"  # type: ignore[attr-defined]


class Scaled:
    """A class plugin: instantiated without arguments."""

    reward_name = "scaled"

    def __call__(self, trajectory: Trajectory) -> RewardResult:
        return RewardResult(0.25, {"part": 0.5})


# -- built-ins -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [(CallStatus.OK, 1.0), (CallStatus.ERROR, 0.0), (CallStatus.CANCELLED, 0.0), (None, 0.0)],
)
def test_success(status: CallStatus | None, expected: float) -> None:
    assert rewards.success(trajectory(status=status)) == expected


@pytest.mark.parametrize(
    ("output", "target", "expected"),
    [
        (None, 400, 0.0),
        ("", 400, 0.0),
        ("x" * 100, 400, 0.25),
        ("x" * 400, 400, 1.0),
        ("x" * 5000, 400, 1.0),
        ("abc", 0, 1.0),
        ("x" * 5, 10, 0.5),
    ],
)
def test_answer_length(output: str | None, target: int, expected: float) -> None:
    assert answer_length(trajectory(output=output), target=target) == expected


@pytest.mark.parametrize(
    ("steps", "budget", "expected"),
    [
        ([], 8, 1.0),
        ([step(seq=0)], 8, 1.0),
        ([step(seq=0), step(seq=1, kind=StepKind.TOOL)], 8, 0.875),
        ([step(seq=i, kind=StepKind.TOOL) for i in range(4)], 8, 0.5),
        ([step(seq=i, kind=StepKind.TOOL) for i in range(12)], 8, 0.0),
        # no tool steps recorded: the tool calls the LLM asked for count instead
        ([step(seq=0, tool_calls=["a", "b"]), step(seq=1, tool_calls=["c", "d"])], 8, 0.5),
        ([step(seq=0, kind=StepKind.TOOL)], 0, 0.0),
    ],
    ids=["none", "llm-only", "one-tool", "half", "over-budget", "asked-for", "zero-budget"],
)
def test_tool_calls(steps: list[Any], budget: int, expected: float) -> None:
    assert tool_calls(trajectory(steps=steps), budget=budget) == expected


@pytest.mark.parametrize(
    ("duration", "target", "expected"),
    [
        (timedelta(0), 10.0, 1.0),
        (timedelta(seconds=10), 10.0, 0.5),
        (timedelta(seconds=30), 10.0, 0.25),
        (timedelta(seconds=-5), 10.0, 1.0),
        (timedelta(seconds=3), 0.0, 0.0),
    ],
    ids=["instant", "at-target", "3x-target", "clock-skew", "zero-target"],
)
def test_latency_efficiency(duration: timedelta, target: float, expected: float) -> None:
    traj = trajectory(started_at=T0, ended_at=T0 + duration)
    assert latency_efficiency(traj, target_seconds=target) == pytest.approx(expected)


def test_latency_efficiency_without_start_is_neutral() -> None:
    assert latency_efficiency(trajectory(started_at=None)) == 0.5


R, TH = FeedbackKind.RATING, FeedbackKind.THUMBS


def fb(kind: FeedbackKind, **kw: Any) -> Any:
    return feedback(kind=kind, rating=kw.pop("rating", None), **kw)


@pytest.mark.parametrize(
    ("feedbacks", "expected"),
    [
        ([], 0.5),
        ([fb(R, rating=5.0)], 1.0),
        ([fb(R, rating=1.0)], 0.0),
        ([fb(R, rating=4.0)], 0.75),  # default scale 1..5
        ([fb(R, rating=7.0, rating_min=0.0, rating_max=10.0)], 0.7),
        ([fb(R, rating=0.5, rating_min=0.0, rating_max=1.0)], 0.5),
        ([fb(R, rating=-3.0, rating_min=-5.0, rating_max=5.0)], 0.2),
        ([fb(TH, thumbs_up=True)], 1.0),
        ([fb(TH, thumbs_up=False)], 0.0),
        ([fb(TH, thumbs_up=True), fb(R, rating=2.0), fb(TH, thumbs_up=False)], 1.25 / 3),
        ([fb(R, rating=None)], 0.5),  # a rating without a number
        ([fb(TH, thumbs_up=None)], 0.5),
        ([fb(FeedbackKind.CORRECTION, correction="x"), fb(FeedbackKind.PREFERENCE)], 0.5),
    ],
    ids=[
        "none",
        "top",
        "bottom",
        "four-of-five",
        "seven-of-ten",
        "unit-scale",
        "negative-scale",
        "thumbs-up",
        "thumbs-down",
        "mixed",
        "rating-null",
        "thumbs-null",
        "not-judgements",
    ],
)
def test_user_rating(feedbacks: list[Any], expected: float) -> None:
    assert user_rating(trajectory(feedback=feedbacks)) == pytest.approx(expected)


def test_user_rating_wants_feedback() -> None:
    assert getattr(user_rating, "wants_feedback", False) is True
    assert Rewarder(user_rating).wants_feedback
    assert not Rewarder(rewards.success).wants_feedback


@pytest.mark.parametrize(
    "fn", [rewards.success, answer_length, tool_calls, latency_efficiency, user_rating]
)
@pytest.mark.parametrize(
    "traj",
    [
        trajectory(),
        trajectory(status=CallStatus.ERROR, output=None, steps=[], started_at=None),
        trajectory(
            ended_at=T0 + timedelta(days=1), output="x" * 10_000, feedback=[fb(TH, thumbs_up=True)]
        ),
    ],
    ids=["typical", "empty", "extreme"],
)
def test_built_ins_are_in_the_unit_interval(fn: Any, traj: Trajectory) -> None:
    assert 0.0 <= fn(traj) <= 1.0


# -- Composite -------------------------------------------------------------------------------


def test_composite_normalises_weights_and_names_components() -> None:
    composite = Composite(
        {
            "streams.rewards:success": 2.0,
            "streams.rewards:answer_length": 1.0,
            "streams.rewards:user_rating": 1.0,
        }
    )
    assert [w for _, _, w in composite.parts] == [0.5, 0.25, 0.25]
    result = composite(trajectory(output="x" * 200, status=CallStatus.OK))
    assert result.components == {"success": 1.0, "answer_length": 0.5, "user_rating": 0.5}
    assert result.value == pytest.approx(0.5 * 1.0 + 0.25 * 0.5 + 0.25 * 0.5)
    assert composite.reward_name == (
        "composite(streams.rewards:success=2,streams.rewards:answer_length=1,"
        "streams.rewards:user_rating=1)"
    )
    assert composite.wants_feedback


def test_composite_of_composite_results_and_dotted_names() -> None:
    composite = Composite(
        {"tests.unit.core.test_rewards:Scaled": 1.0, "streams.rewards.success": 3.0}
    )
    result = composite(trajectory(status=CallStatus.ERROR))
    assert result.components == {"Scaled": 0.25, "streams.rewards.success": 0.0}
    assert result.value == pytest.approx(0.25 * 0.25)
    assert not composite.wants_feedback


def test_composite_uses_the_loader_seam() -> None:
    composite = Composite({"a:x": 1.0, "b:y": 3.0}, loader=lambda name: constant(len(name)))
    assert composite(trajectory()).value == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ({}, "empty"),
        ({"streams.rewards:success": 0.0}, "sum to more than 0"),
        ({"streams.rewards:success": 1.0, "streams.rewards:answer_length": -0.5}, "non-negative"),
        ({"streams.rewards:nope": 1.0}, "has no attribute 'nope'"),
        ({"streams.rewards:RECENT": 1.0}, "has no attribute"),
        ({"streams.rewards:__doc__": 1.0}, "not callable"),
    ],
    ids=["empty", "zero-sum", "negative", "unknown", "missing", "not-callable"],
)
def test_composite_refuses_bad_weights(weights: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Composite(weights)


def test_composite_functions_with_the_same_short_name_both_count() -> None:
    composite = Composite(
        {"streams.rewards:success": 1.0, "tests.unit.core.test_rewards:success": 1.0}
    )
    result = composite(trajectory(status=CallStatus.OK))
    assert result.value == pytest.approx(0.5)
    assert len(result.components) == 2


# -- Rewarder --------------------------------------------------------------------------------


def test_rewarder_builds_the_rewarded_record() -> None:
    the_mark = mark(labels=["gold", "eval"], metadata={"team": "search"}, run_id=2)
    traj = trajectory(
        mark=the_mark,
        run_id=2,
        steps=[
            step(seq=0, response_id="r0", response_model="m-early"),
            step(seq=1, response_id="r1", response_model=None, request_model="m-last"),
            step(seq=2, kind=StepKind.TOOL),
        ],
    )
    out = Rewarder(rewards.success)(traj)
    assert (out.trajectory_id, out.call_id, out.task_id, out.run_id) == (
        traj.trajectory_id,
        traj.call_id,
        traj.task_id,
        2,
    )
    assert out.msg_ids == ["r0", "r1"]
    assert (out.reward, out.components) == (1.0, {})
    assert (out.reward_fn, out.reward_version) == ("streams.rewards:success", "1")
    assert (out.agent_name, out.model, out.succeeded) == ("researcher", "m-last", True)
    assert out.event_time == traj.ended_at
    assert (out.labels, out.metadata) == (["gold", "eval"], {"team": "search"})


def test_rewarder_failed_call_without_mark() -> None:
    out = Rewarder(rewards.success)(trajectory(status=CallStatus.ERROR, steps=[]))
    assert (out.reward, out.succeeded, out.model, out.labels, out.metadata) == (
        0.0,
        False,
        None,
        [],
        {},
    )


@pytest.mark.parametrize(
    ("fn", "name", "version"),
    [
        (rewards.success, "streams.rewards:success", "1"),
        (always_zero, "tests.unit.core.test_rewards:always_zero", "7"),
        (Scaled(), "scaled", "1"),
        (lambda t: 1.0, "tests.unit.core.test_rewards:<lambda>", "1"),
    ],
    ids=["built-in", "versioned", "named-class", "lambda"],
)
def test_rewarder_records_name_and_version(fn: Any, name: str, version: str) -> None:
    # test modules import under two names; compare the part after the module
    out = Rewarder(fn)(trajectory())
    assert out.reward_fn.rpartition(":")[2] == name.rpartition(":")[2]
    assert out.reward_version == version


def test_rewarder_explicit_name_wins() -> None:
    assert Rewarder(always_zero, name="custom")(trajectory()).reward_fn == "custom"


def test_rewarder_keeps_components() -> None:
    out = Rewarder(Scaled())(trajectory())
    assert (out.reward, out.components) == (0.25, {"part": 0.5})


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (constant(math.nan), "non-finite reward"),
        (constant(math.inf), "non-finite reward"),
        (constant(-math.inf), "non-finite reward"),
        (lambda t: RewardResult(0.5, {"a": 1.0, "b": math.nan}), "non-finite b"),
        (lambda t: 1 / 0, "raised ZeroDivisionError"),
        (lambda t: "high", "raised ValueError"),
        (lambda t: None, "raised TypeError"),
    ],
    ids=["nan", "inf", "-inf", "nan-component", "raises", "not-a-number", "none"],
)
def test_rewarder_refuses_bad_results(fn: Any, match: str) -> None:
    with pytest.raises(RewardError, match=match):
        Rewarder(fn, name="bad")(trajectory())


def test_rewarder_keeps_the_cause() -> None:
    with pytest.raises(RewardError) as info:
        Rewarder(lambda t: 1 / 0)(trajectory())
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_integer_rewards_are_floats() -> None:
    out = Rewarder(lambda t: 1)(trajectory())
    assert out.reward == 1.0 and isinstance(out.reward, float)


# -- load_reward -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("streams.rewards:success", 1.0),
        ("streams.core.rewards.answer_length", 0.015),
        ("tests.unit.core.test_rewards:always_zero", 0.0),
        ("tests.unit.core.test_rewards:Scaled", 0.25),
    ],
)
def test_load_reward_by_dotted_path(name: str, value: float) -> None:
    fn = load_reward(name)
    assert Rewarder(fn)(trajectory(output="Paris.")).reward == pytest.approx(value)


def test_load_composite() -> None:
    fn = load_reward("composite", {"streams.rewards:success": 1, "streams.rewards:user_rating": 1})
    assert isinstance(fn, Composite)
    assert Rewarder(fn)(trajectory()).reward == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("no_such_module:fn", "cannot import 'no_such_module'"),
        ("streams.rewards:nope", "has no attribute 'nope'"),
        ("nope", "use package.module:attribute"),
        ("streams.rewards:__name__", "not callable"),
        ("composite", "reward.weights is empty"),
    ],
)
def test_load_reward_unknown_path_is_a_config_error(name: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_reward(name)
