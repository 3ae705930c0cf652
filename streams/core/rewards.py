"""Rewards: a number for each trajectory, from pluggable functions.

A reward function is any callable ``fn(trajectory) -> float`` or
``fn(trajectory) -> RewardResult`` (a value with named components). Optional attributes on the
callable: ``reward_name``, ``reward_version`` (recorded with every reward) and
``wants_feedback`` (the reward stage then waits up to the feedback grace period for user
feedback before scoring) and ``needs_verdict`` (the function takes the LLM judge's verdict as
a second argument, ``fn(trajectory, verdict)``; the reward stage asks the judge once per call
and scores when the verdict is there, see :mod:`streams.core.judge`). Functions are named in
the settings by dotted path (``package.module:function``) or by an entry point of group
``trajstream.rewards``.

A result may carry a reward per LLM step (``RewardResult.step_rewards``, keyed by msg_id);
``reward.step_discount`` (gamma) gives every step without one ``reward * gamma ** (n - 1 - i)``
(step ``i`` of ``n``, so the last step gets the whole reward). The feedback stage then sends
one ``/feedback`` per distinct reward (:func:`streams.core.feedback.feedback_requests`).

The rewarded record's msg_ids are those the reward is sent for
(:func:`streams.core.arms.trained_msg_ids`): none for a call production answered in whole or in
part, unless ``reward.train_mixed`` (``train_mixed``) sends a mixed call's steps that Trinity
answered in full.

Built-ins (all in [0, 1]): :func:`success`, :func:`answer_length`, :func:`tool_calls`,
:func:`latency_efficiency`, :func:`user_rating`, :func:`judge` (the LLM judge's score), and
:class:`Composite`, a weighted sum of others with the weights normalised to 1::

    Composite({"streams.rewards:success": 0.4, "streams.rewards:user_rating": 0.3,
               "streams.rewards:latency_efficiency": 0.2, "streams.rewards:answer_length": 0.1})

:class:`Rewarder` applies one function and refuses a result that is NaN or infinite, or a
function that raises: :class:`~streams.errors.RewardError`, and the trajectory goes to the
dead-letter topic instead of Trinity.

May import: the standard library, :mod:`streams.models`, :mod:`streams.errors`, the core.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, RewardError
from ..models import (
    CallStatus,
    FeedbackKind,
    JudgeVerdict,
    RewardedTrajectory,
    StepKind,
    Trajectory,
)
from .arms import trained_msg_ids
from .assembly import last_model
from .plugins import load_object

__all__ = [
    "Composite",
    "RewardFn",
    "RewardResult",
    "Rewarder",
    "answer_length",
    "build_rewarder",
    "judge",
    "latency_efficiency",
    "load_reward",
    "success",
    "tool_calls",
    "user_rating",
]


@dataclass(frozen=True)
class RewardResult:
    """A reward with named parts and, optionally, a reward per LLM step.

    ``step_rewards`` is keyed by msg_id (the response id of an LLM step, as in
    ``trajectory.msg_ids``); a step left out gets ``value``. Keyed by msg_id rather than by
    position, so that a function cannot reward the wrong step when steps without a response id
    are skipped::

        def last_step_counts(trajectory):
            ids = trajectory.msg_ids
            return RewardResult(1.0, step_rewards={m: 0.2 for m in ids[:-1]})
    """

    value: float
    components: Mapping[str, float] = field(default_factory=dict)
    step_rewards: Mapping[str, float] = field(default_factory=dict)


RewardFn = Callable[[Trajectory], "float | RewardResult"]


def success(trajectory: Trajectory) -> float:
    """1.0 when the call ended OK, else 0.0."""
    return 1.0 if trajectory.status is CallStatus.OK else 0.0


def answer_length(trajectory: Trajectory, target: int = 400) -> float:
    """Rises with the length of the final output up to ``target`` characters, then stays at 1."""
    length = len(trajectory.output or "")
    return min(1.0, length / target) if target > 0 else 1.0


def tool_calls(trajectory: Trajectory, budget: int = 8) -> float:
    """1.0 for a call that used no tools, falling linearly to 0 at ``budget`` tool calls."""
    used = sum(1 for s in trajectory.steps if s.kind is StepKind.TOOL) or sum(
        len(s.tool_calls) for s in trajectory.steps
    )
    return max(0.0, 1.0 - used / budget) if budget > 0 else 0.0


def latency_efficiency(trajectory: Trajectory, target_seconds: float = 10.0) -> float:
    """1.0 for an instant call, 0.5 at ``target_seconds``, towards 0 for slower ones."""
    if trajectory.started_at is None:
        return 0.5
    seconds = max(0.0, (trajectory.ended_at - trajectory.started_at).total_seconds())
    return target_seconds / (target_seconds + seconds) if target_seconds > 0 else 0.0


def user_rating(trajectory: Trajectory) -> float:
    """The users' judgement normalised to [0, 1]: ratings by their scale, thumbs as 1 or 0.

    Several judgements are averaged; without any, 0.5 (neutral).
    """
    scores = []
    for fb in trajectory.feedback:
        if fb.kind is FeedbackKind.RATING and fb.rating is not None:
            span = fb.rating_max - fb.rating_min
            if span > 0:
                scores.append(min(1.0, max(0.0, (fb.rating - fb.rating_min) / span)))
        elif fb.kind is FeedbackKind.THUMBS and fb.thumbs_up is not None:
            scores.append(1.0 if fb.thumbs_up else 0.0)
    return sum(scores) / len(scores) if scores else 0.5


user_rating.wants_feedback = True  # type: ignore[attr-defined]


def judge(trajectory: Trajectory, verdict: JudgeVerdict | None = None) -> float:
    """The LLM judge's score of the call (``reward.judge`` settings; ``streams.core.judge``).

    The reward stage asks the judge once per call and calls this with the verdict it stored;
    a verdict without a score never reaches here (the call is a dead letter with its error).
    """
    if verdict is None or verdict.score is None:
        raise ValueError("no judge verdict for this call")
    return verdict.score


judge.needs_verdict = True  # type: ignore[attr-defined]


class Composite:
    """A weighted sum of reward functions; weights are normalised to sum to 1."""

    def __init__(self, weights: Mapping[str, float], loader: Callable[[str], object] = load_object):
        if not weights:
            raise ConfigError("reward.weights is empty: name at least one reward function")
        total = sum(weights.values())
        if total <= 0 or any(w < 0 for w in weights.values()):
            raise ConfigError("reward.weights must be non-negative and sum to more than 0")
        shorts = [name.rpartition(":")[2] or name for name in weights]
        # components are named by the function's short name, unless two share it
        labels = [s if shorts.count(s) == 1 else n for s, n in zip(shorts, weights, strict=True)]
        self.parts = [
            (label, _as_fn(loader(name), name), w / total)
            for label, (name, w) in zip(labels, weights.items(), strict=True)
        ]
        self.reward_name = "composite(" + ",".join(f"{n}={w:g}" for n, w in weights.items()) + ")"
        self.reward_version = "1"
        self.wants_feedback = any(getattr(fn, "wants_feedback", False) for _, fn, _ in self.parts)
        self.needs_verdict = any(_needs_verdict(fn) for _, fn, _ in self.parts)

    def __call__(self, trajectory: Trajectory, verdict: JudgeVerdict | None = None) -> RewardResult:
        components = {label: _value(_apply(fn, trajectory, verdict)) for label, fn, _ in self.parts}
        value = sum(w * components[label] for label, _, w in self.parts)
        return RewardResult(value, components)


def _as_fn(obj: object, name: str) -> RewardFn:
    if isinstance(obj, type):
        obj = obj()
    if not callable(obj):
        raise ConfigError(f"reward function {name!r} is not callable")
    return obj


def _needs_verdict(fn: object) -> bool:
    return bool(getattr(fn, "needs_verdict", False))


def _apply(fn: RewardFn, trajectory: Trajectory, verdict: JudgeVerdict | None) -> Any:
    """``fn(trajectory)``, or ``fn(trajectory, verdict)`` for a function that needs the judge's
    verdict."""
    if _needs_verdict(fn):
        return fn(trajectory, verdict)  # type: ignore[call-arg]
    return fn(trajectory)


def _value(result: float | RewardResult) -> float:
    return float(result.value if isinstance(result, RewardResult) else result)


def load_reward(name: str, weights: Mapping[str, float] | None = None) -> RewardFn:
    """The reward function named in the settings (``composite`` uses ``weights``)."""
    if name == "composite":
        return Composite(weights or {})
    return _as_fn(load_object(name), name)


def build_rewarder(
    function: str,
    weights: Mapping[str, float] | None = None,
    step_discount: float | None = None,
    *,
    train_mixed: bool = False,
) -> Rewarder:
    """The rewarder for the settings' ``reward.function`` (and ``reward.weights``,
    ``reward.step_discount``, ``reward.train_mixed``), as the live workers and ``trajstream
    replay`` both build it, so every record names it the same way."""
    name = None if function == "composite" else function
    return Rewarder(
        load_reward(function, weights),
        name=name,
        step_discount=step_discount,
        train_mixed=train_mixed,
    )


class Rewarder:
    """Applies one reward function to trajectories and builds the rewarded records."""

    def __init__(
        self,
        fn: RewardFn,
        name: str | None = None,
        step_discount: float | None = None,
        *,
        train_mixed: bool = False,
    ):
        if step_discount is not None and not 0.0 < step_discount <= 1.0:
            raise ConfigError(f"reward.step_discount must be in (0, 1], got {step_discount}")
        self.fn = fn
        self.name = name or getattr(fn, "reward_name", None) or _qualname(fn)
        self.version = str(getattr(fn, "reward_version", "1"))
        if step_discount is not None:
            # the discount changes what is sent: part of the recorded version (and so of a
            # replay's identity); without it, versions stay as they were
            self.version += f"+step_discount={step_discount:g}"
        if train_mixed:  # changes what is sent, as the discount does
            self.version += "+train_mixed"
        self.train_mixed = train_mixed
        self.wants_feedback = bool(getattr(fn, "wants_feedback", False))
        self.needs_verdict = _needs_verdict(fn)
        self.step_discount = step_discount

    def __call__(
        self, trajectory: Trajectory, verdict: JudgeVerdict | None = None
    ) -> RewardedTrajectory:
        """Score ``trajectory`` (with the judge's ``verdict``, for a function that needs it)."""
        try:
            result = _apply(self.fn, trajectory, verdict)
            value = _value(result)
            components = dict(result.components) if isinstance(result, RewardResult) else {}
            steps = (
                {str(k): float(v) for k, v in result.step_rewards.items()}
                if isinstance(result, RewardResult)
                else {}
            )
        except Exception as exc:
            raise RewardError(
                f"reward function {self.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        bad = [k for k, v in {"reward": value, **components}.items() if not math.isfinite(v)]
        bad += [f"step reward of {k}" for k, v in steps.items() if not math.isfinite(v)]
        if bad:
            raise RewardError(f"reward function {self.name} returned a non-finite {', '.join(bad)}")
        msg_ids = trained_msg_ids(trajectory, train_mixed=self.train_mixed)
        step_rewards = self._steps(trajectory.msg_ids, value, steps)
        if len(msg_ids) < len(trajectory.msg_ids):  # only the steps sent are rewarded apart
            step_rewards = {m: step_rewards[m] for m in msg_ids if m in step_rewards}
            if all(r == value for r in step_rewards.values()):
                step_rewards = {}
        mark = trajectory.mark
        return RewardedTrajectory(
            trajectory_id=trajectory.trajectory_id,
            call_id=trajectory.call_id,
            task_id=trajectory.task_id,
            run_id=trajectory.run_id,
            msg_ids=msg_ids,
            reward=value,
            components=components,
            reward_fn=self.name,
            reward_version=self.version,
            agent_name=trajectory.agent_name,
            model=last_model(trajectory.steps),
            succeeded=trajectory.status is CallStatus.OK,
            event_time=trajectory.ended_at,
            labels=list(mark.labels) if mark else [],
            metadata=dict(mark.metadata) if mark else {},
            step_rewards=step_rewards,
            policy_version=trajectory.policy_version,
        )

    def _steps(self, msg_ids: list[str], value: float, steps: dict[str, float]) -> dict[str, float]:
        """Every msg_id's reward when they are not all ``value`` (else empty, the common case)."""
        if not steps and self.step_discount is None:
            return {}  # the common case: every step gets the call's reward
        unknown = sorted(set(steps) - set(msg_ids))
        if unknown:
            raise RewardError(
                f"reward function {self.name} rewarded steps that are not in the trajectory: "
                f"{', '.join(unknown[:5])}"
            )
        gamma, n = self.step_discount, len(msg_ids)
        out = {
            m: steps[m] if m in steps else value if gamma is None else value * gamma ** (n - 1 - i)
            for i, m in enumerate(msg_ids)
        }
        return out if any(r != value for r in out.values()) else {}


def _qualname(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    if module == __name__:
        # the built-ins' public name (recorded as ``reward_fn``, part of a replay's id) is the
        # documented ``streams.rewards``, whatever module holds them
        module = "streams.rewards"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}"
