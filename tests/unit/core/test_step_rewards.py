"""Per-step rewards: what a reward function or ``reward.step_discount`` gives each LLM step,
and the ``/feedback`` requests a rewarded trajectory becomes (one per distinct reward, with
exactly its msg_ids), table-driven."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from streams.codec import SchemaRegistry
from streams.core.feedback import FeedbackRequest, feedback_requests
from streams.core.rewards import Rewarder, RewardResult, build_rewarder
from streams.errors import ConfigError, RewardError
from streams.models import RewardedTrajectory, StepKind, Trajectory
from tests.unit.factories import rewarded, step, trajectory


def first_steps_half(t: Trajectory) -> RewardResult:
    """A reward function for the tests (also named by the both-runners table): the last step
    gets the trajectory's reward, earlier steps half of it."""
    value = 1.0 if t.output else 0.0
    return RewardResult(value, step_rewards={m: value / 2 for m in t.msg_ids[:-1]})


def traj(n: int) -> Trajectory:
    steps = [step("c", i) for i in range(n)] + [step("c", n, kind=StepKind.TOOL)]
    return trajectory("c", steps=steps)


def returning(value: float, steps: Mapping[str, float] | None = None):  # type: ignore[no-untyped-def]
    return lambda t: RewardResult(value, step_rewards=dict(steps or {}))


@pytest.mark.parametrize(
    ("fn", "gamma", "n", "expected"),
    [
        # a plain float, no discount: no per-step rewards (every msg_id gets the reward)
        (lambda t: 1.0, None, 3, {}),
        # the discount: step i of n gets r * gamma ** (n - 1 - i)
        (lambda t: 1.0, 0.5, 3, {0: 0.25, 1: 0.5, 2: 1.0}),
        (lambda t: 0.8, 0.9, 2, {0: pytest.approx(0.72), 1: 0.8}),
        # gamma 1, or a single step: all equal, so nothing per step
        (lambda t: 1.0, 1.0, 3, {}),
        (lambda t: 1.0, 0.5, 1, {}),
        # a zero reward discounts to zero everywhere
        (lambda t: 0.0, 0.5, 3, {}),
        # the function's own step rewards; the others get the reward
        (returning(1.0, {"chatcmpl-c-0": 0.0}), None, 3, {0: 0.0, 1: 1.0, 2: 1.0}),
        # with a discount, the function's step rewards win; the discount fills the rest
        (returning(1.0, {"chatcmpl-c-0": 0.9}), 0.5, 3, {0: 0.9, 1: 0.5, 2: 1.0}),
        (first_steps_half, None, 3, {0: 0.5, 1: 0.5, 2: 1.0}),
    ],
)
def test_step_rewards(fn, gamma: float | None, n: int, expected: dict[int, float]) -> None:  # type: ignore[no-untyped-def]
    t = traj(n)
    assert len(t.msg_ids) == n  # the tool step has no msg_id
    out = Rewarder(fn, name="f", step_discount=gamma)(t)
    assert out.step_rewards == {f"chatcmpl-c-{i}": r for i, r in expected.items()}


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ({"chatcmpl-other": 0.5}, "not in the trajectory: chatcmpl-other"),
        ({"chatcmpl-c-0": float("nan")}, "non-finite step reward of chatcmpl-c-0"),
        ({"chatcmpl-c-0": float("inf")}, "non-finite step reward of chatcmpl-c-0"),
    ],
)
def test_bad_step_rewards_are_a_reward_error(steps: dict[str, float], reason: str) -> None:
    with pytest.raises(RewardError, match=reason):
        Rewarder(returning(1.0, steps), name="f")(traj(2))


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.5])
def test_a_discount_out_of_range_is_a_config_error(gamma: float) -> None:
    with pytest.raises(ConfigError, match=r"reward\.step_discount"):
        build_rewarder("streams.rewards:success", step_discount=gamma)


def requests(msg_ids: list[str], reward: float, steps: dict[str, float]) -> list[tuple]:  # type: ignore[type-arg]
    r = rewarded("t", reward, msg_ids=msg_ids, step_rewards=steps, task_id="task-t", run_id=2)
    out = feedback_requests(r)
    assert all(q.task_id == "task-t" and q.run_id == 2 for q in out)
    return [(q.reward, q.msg_ids) for q in out]


@pytest.mark.parametrize(
    ("msg_ids", "reward", "steps", "expected"),
    [
        # the common case: one request with every msg_id, in step order
        (["a", "b", "c"], 1.0, {}, [(1.0, ["a", "b", "c"])]),
        # one per distinct reward, in the order of each reward's first step
        (
            ["a", "b", "c"],
            1.0,
            {"a": 0.25, "b": 0.5, "c": 1.0},
            [(0.25, ["a"]), (0.5, ["b"]), (1.0, ["c"])],
        ),
        # equal rewards share a request, even when not adjacent
        (["a", "b", "c", "d"], 1.0, {"a": 0.0, "c": 0.0}, [(0.0, ["a", "c"]), (1.0, ["b", "d"])]),
        # a partial map: the rest get the trajectory's reward
        (["a", "b"], 0.3, {"b": 0.9}, [(0.3, ["a"]), (0.9, ["b"])]),
    ],
)
def test_one_feedback_request_per_distinct_reward(
    msg_ids: list[str],
    reward: float,
    steps: dict[str, float],
    expected: list[tuple],  # type: ignore[type-arg]
) -> None:
    assert requests(msg_ids, reward, steps) == expected


def test_requests_cover_every_msg_id_once() -> None:
    r = rewarded("t", 1.0, msg_ids=["a", "b", "c"], step_rewards={"a": 0.1, "c": 0.1})
    ids = [m for q in feedback_requests(r) for m in q.msg_ids]
    assert sorted(ids) == ["a", "b", "c"]
    assert feedback_requests(r)[0] == FeedbackRequest(["a", "c"], 0.1, r.task_id, r.run_id)


def test_step_rewards_round_trip_and_old_records_decode_without_them() -> None:
    codec = SchemaRegistry.default()
    r = rewarded("t", 1.0, msg_ids=["a", "b"], step_rewards={"a": 0.5, "b": 1.0})
    assert codec.decode_as(codec.encode(r), RewardedTrajectory) == r
    with pytest.raises(ValueError, match="step reward of a must be a finite number"):
        rewarded("t", 1.0, msg_ids=["a"], step_rewards={"a": float("nan")})


def test_the_discount_is_part_of_the_recorded_version() -> None:
    """A replay's identity includes the reward version: a replay with another discount is
    another replay, not one that was sent already."""
    assert build_rewarder("streams.rewards:success").version == "1"
    assert build_rewarder("streams.rewards:success", step_discount=0.9).version == (
        "1+step_discount=0.9"
    )
