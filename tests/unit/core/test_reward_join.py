"""The reward stage driven with in-memory stores and a fake clock: the feedback grace period,
feedback before or after its trajectory, incomplete trajectories, nothing trainable."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streams.core.reward_join import NOTHING_TRAINABLE
from streams.core.rewards import build_rewarder
from streams.models import FeedbackKind, RewardedTrajectory, StepKind
from tests.unit.core.harness import Core
from tests.unit.factories import at, end, feedback, start, step

CALL = [(start(), 0), (step(seq=0), 1), (end(step_count=1), 2)]  # closes at 2 s


def rewards(core: Core) -> list[tuple[float, int]]:
    """(reward, number of feedbacks attached) of every rewarded record so far."""
    out = []
    scored = iter(core.scored)
    for emit in core.out.emits:
        if emit.topic == "rewarded":
            assert isinstance(emit.record, RewardedTrajectory)
            used = next(scored)
            assert used.rewarded is emit.record  # one scoring per rewarded record, in order
            out.append((emit.record.reward, len(used.feedback)))
    assert next(scored, None) is None
    return out


@pytest.mark.parametrize(
    ("grace", "feedback_at", "tick_at", "expected"),
    [
        # user_rating wants feedback: it waits up to the grace period for the first one
        (0, None, None, [(0.5, 0)]),  # no grace: scored at once, neutral
        (10, None, 11, []),  # grace runs from the trajectory's arrival at 2 s: until 12 s
        (10, None, 12, [(0.5, 0)]),  # grace over: scored without feedback
        (10, 5, None, [(0.75, 1)]),  # feedback within the grace: scored with it, at once
        (10, 1.5, None, [(0.75, 1)]),  # feedback before the trajectory: waits for it
        (10, 20, 12, [(0.5, 0)]),  # feedback after the grace: the reward was sent already
    ],
)
def test_the_feedback_grace_period(
    grace: float, feedback_at: float | None, tick_at: float | None, expected: list
) -> None:
    core = Core(
        rewarder=build_rewarder("streams.rewards:user_rating"),
        feedback_grace=timedelta(seconds=grace),
    )
    events = [(r, s, core.event) for r, s in CALL]
    if feedback_at is not None:
        events.append((feedback(rating=4.0), feedback_at, core.feedback))
    for record, seconds, feed in sorted(events, key=lambda e: e[1]):
        if tick_at is not None and tick_at < seconds:
            core.tick(at(tick_at))
            tick_at = None
        feed(record, at(seconds))
    if tick_at is not None:
        core.tick(at(tick_at))
    assert rewards(core) == expected


def test_feedback_without_its_trajectory_is_forgotten_after_abandon_plus_grace() -> None:
    core = Core(
        rewarder=build_rewarder("streams.rewards:user_rating"),
        feedback_grace=timedelta(seconds=10),
    )
    core.feedback(feedback(), at(0))
    core.tick(at(69))
    assert core.awaiting.get(b"call-1") is not None
    out = core.tick(at(70))
    assert out.stats["user_feedback.unmatched"] == 1
    assert core.awaiting.get(b"call-1") is None


@pytest.mark.parametrize(("score_incomplete", "scored"), [(False, 0), (True, 1)])
def test_abandoned_trajectories_are_scored_only_when_asked(
    score_incomplete: bool, scored: int
) -> None:
    core = Core(score_incomplete=score_incomplete)
    core.event(start(), at(0))
    core.event(step(seq=0), at(1))
    core.tick(at(61))
    assert len(core.topic("trajectories")) == 1
    assert len(core.topic("rewarded")) == scored


def test_a_call_without_an_llm_step_is_a_reward_stage_outcome_not_a_feedback() -> None:
    """Nothing trainable: a reward-stage dead letter with the reason, and no rewarded record
    (so no feedback request at all)."""
    core = Core()
    core.event(start(), at(0))
    core.event(step(seq=0, kind=StepKind.TOOL), at(1))
    core.event(end(step_count=1), at(2))
    assert core.topic("rewarded") == []
    assert core.rejects() == [("reward", NOTHING_TRAINABLE)]
    assert core.out.rejects[0].payload  # the trajectory, for a later look


def test_a_reward_function_that_fails_is_a_reward_dead_letter() -> None:
    def broken(t: object) -> float:
        raise ValueError("boom")

    from streams.core.rewards import Rewarder

    core = Core(rewarder=Rewarder(broken, name="tests:broken"))
    for record, seconds in CALL:
        core.event(record, at(seconds))
    assert core.topic("rewarded") == []
    ((stage, reason),) = core.rejects()
    assert stage == "reward" and "boom" in reason


def test_a_trajectory_or_a_tick_on_the_user_feedback_topic_is_a_dead_letter() -> None:
    """No input topic can inject training data or move the clock."""
    from tests.unit.core.harness import tick_record
    from tests.unit.factories import trajectory

    core = Core()
    out = core.feedback(trajectory(), at(0))
    assert [(r.stage, r.reason) for r in out.rejects] == [
        ("reward", "io.trajstream.Trajectory does not belong on user-feedback")
    ]
    out = core.feedback(tick_record(at(0)), at(0))
    assert [r.reason for r in out.rejects] == [
        "io.trajstream.Tick does not belong on user-feedback"
    ]
    assert core.topic("rewarded") == []


def corrected_means_wrong(t):  # type: ignore[no-untyped-def]
    """The rewards guide's example (docs/how-to/rewards.md): a call a user corrected gets 0, others 1 when they succeeded."""
    from streams.models import CallStatus, FeedbackKind

    if any(f.kind is FeedbackKind.CORRECTION and f.correction for f in t.feedback):
        return 0.0
    return 1.0 if t.status is CallStatus.OK else 0.0


corrected_means_wrong.wants_feedback = True  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fb", "expected"),
    [
        (None, [(1.0, 0)]),
        ({"kind": FeedbackKind.CORRECTION, "rating": None, "correction": "Canberra."}, [(0.0, 1)]),
        ({"kind": FeedbackKind.CORRECTION, "rating": None, "correction": None}, [(1.0, 1)]),
        ({"rating": 5.0}, [(1.0, 1)]),
    ],
)
def test_a_reward_function_reads_corrections_live(fb: dict | None, expected: list) -> None:  # type: ignore[type-arg]
    from streams.core.rewards import Rewarder

    core = Core(rewarder=Rewarder(corrected_means_wrong), feedback_grace=timedelta(seconds=10))
    for record, seconds in CALL:
        core.event(record, at(seconds))
    if fb is not None:
        core.feedback(feedback(**fb), at(5))
    core.tick(at(20))
    assert rewards(core) == expected


SHADOWED = start(  # selected in shadow mode: production answers, Trinity's copy recorded
    attributes={
        "trajstream.route.upstream": "production",
        "trajstream.route.mode": "shadow",
        "trajstream.route.selected": "true",
    }
)


def test_a_shadowed_call_whose_shadow_answers_were_all_lost_is_counted_not_a_dead_letter() -> None:
    """Shadow mode: production answered, Trinity (down or slow) answered no shadow copy. That
    is what an outage costs shadow mode, counted; no dead letter per call, nothing to train."""
    core = Core()
    core.event(SHADOWED, at(0))
    core.event(step(seq=0, upstream="production"), at(1))  # no shadow_response_id: lost
    core.event(end(step_count=1), at(2))
    assert len(core.topic("trajectories")) == 1  # the trajectory itself is kept
    assert core.topic("rewarded") == [] and core.rejects() == []
    assert core.out.stats["trajectories.shadow_lost"] == 1


def test_a_shadowed_call_with_a_shadow_answer_is_rewarded_for_it() -> None:
    core = Core()
    core.event(SHADOWED, at(0))
    core.event(step(seq=0, upstream="production", shadow_response_id="chatcmpl-s-0"), at(1))
    core.event(end(step_count=1), at(2))
    (rewarded,) = core.topic("rewarded")
    assert rewarded.msg_ids == ["chatcmpl-s-0"] and core.rejects() == []
