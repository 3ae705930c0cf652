"""The LLM judge's rules, broker-free: the prompt, its hash, the strict answer format, verdicts,
and the reward stage asking once per call and keeping the first verdict."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from streams.core.judge import (
    JudgeAnswerError,
    JudgeSpec,
    expired,
    parse_score,
    prompt_hash,
    render,
    verdict_of,
)
from streams.core.reward_join import NO_JUDGE, RewardJoin
from streams.core.rewards import build_rewarder
from streams.errors import ConfigError
from streams.models import (
    ChatMessage,
    JudgeRequest,
    JudgeVerdict,
    RewardedTrajectory,
    StoredVerdict,
    Trajectory,
)
from tests.unit.core.harness import CODEC, EDGE, Core
from tests.unit.factories import at, end, feedback, start, step, trajectory

SPEC = JudgeSpec(model="judge-1", rubric="Score the answer from 0 to 1.")


def completion(content: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


# -- the answer format -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"score": 0.8, "reason": "good"}', (0.8, "good")),
        ('  {"score": 1}\n', (1.0, "")),
        ('{"score": 0}', (0.0, "")),
        ('```json\n{"score": 0.25, "reason": "meh"}\n```', (0.25, "meh")),
        ('```\n{"score": 0.5}\n```', (0.5, "")),
        ('{"score": 0.5, "reason": {"why": "nested"}}', (0.5, '{"why": "nested"}')),
    ],
)
def test_a_score_in_the_documented_format_is_read(content: str, expected: tuple) -> None:
    assert parse_score(content) == expected


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("", "empty"),
        ("I would give it 0.8", "not JSON"),
        ("SCORE: 0.8", "not JSON"),
        ('{"score": 0.8', "not JSON"),
        ("[0.8]", "a JSON list, not an object"),
        ("0.8", "a JSON float, not an object"),
        ('{"reason": "no score"}', 'no "score"'),
        ('{"score": "0.8"}', "'0.8' is not a number"),
        ('{"score": true}', "True is not a number"),
        ('{"score": 1.5}', "1.5 is outside [0, 1]"),
        ('{"score": -0.1}', "-0.1 is outside [0, 1]"),
        ('{"score": NaN}', "nan is outside [0, 1]"),
        ('{"score": Infinity}', "inf is outside [0, 1]"),
    ],
)
def test_a_garbage_answer_names_what_was_wrong(content: str, names: str) -> None:
    with pytest.raises(JudgeAnswerError) as err:
        parse_score(content)
    assert str(err.value).startswith("garbage answer: ") and names in str(err.value)


def request(call_id: str = "call-1") -> JudgeRequest:
    return SPEC.request(trajectory(call_id), at(10))


@pytest.mark.parametrize(
    ("body", "score", "error"),
    [
        (completion('{"score": 0.6, "reason": "ok"}'), 0.6, None),
        (completion("lovely"), None, "garbage answer: not JSON"),
        (completion(None), None, "garbage answer: the message content is not text"),
        ({"choices": []}, None, "garbage answer: not a chat completion"),
        (None, None, "garbage answer: not a chat completion"),  # the body was not JSON
        ("a string", None, "garbage answer: not a chat completion"),
    ],
)
def test_a_verdict_has_a_score_or_the_error(body: Any, score: float | None, error: str | None):
    raw = json.dumps(body) if body is not None else "<html>"
    verdict = verdict_of(request(), body, raw, 2, at(12))
    assert verdict.score == score
    assert (verdict.error is None) if error is None else verdict.error.startswith(error)
    assert (verdict.judge_model, verdict.attempts) == ("judge-1", 2)
    assert (verdict.requested_at, verdict.judged_at) == (at(10), at(12))
    assert verdict.prompt_hash == request().prompt_hash
    assert CODEC.decode(CODEC.encode(verdict)) == verdict


def test_a_verdict_keeps_a_bounded_raw_answer() -> None:
    verdict = verdict_of(request(), completion("x" * 100_000), "", 1, at(12))
    assert verdict.error is not None and len(verdict.raw_answer) == 8192


def test_expiry_counts_from_the_request() -> None:
    r = request()
    assert expired(r, at(10) + timedelta(seconds=60), timedelta(seconds=60)) is None
    reason = expired(r, at(10) + timedelta(seconds=61), timedelta(seconds=60))
    assert reason is not None and "reward.judge.max_age_s (60s" in reason


# -- the prompt --------------------------------------------------------------------------------


def test_the_prompt_shows_the_prompt_the_steps_and_the_outcome() -> None:
    text = render(trajectory(status=None, output="Paris.", error_type=None))
    assert text.startswith("## Prompt\n")
    assert "## Steps\n### 1. LLM (" in text and "### 2. tool " in text
    assert text.endswith("## Outcome\nstatus: unknown\noutput: Paris.")


def test_the_prompt_is_bounded_and_keeps_its_outcome() -> None:
    long = trajectory(input_messages=[ChatMessage(role="user", content="y" * 50_000)])
    text = render(long, max_chars=2000)
    assert len(text) <= 2000
    assert "characters cut ...]" in text and text.endswith("output: Paris.")
    assert render(long, max_chars=2000) == text  # deterministic


def test_the_prompt_hash_is_of_rubric_and_prompt() -> None:
    r = request()
    assert r.prompt_hash == prompt_hash(SPEC.rubric, r.prompt) and len(r.prompt_hash) == 64
    assert prompt_hash("a", "bc") != prompt_hash("ab", "c")
    other = JudgeSpec(model="judge-1", rubric="Another rubric.").request(trajectory(), at(10))
    assert other.prompt_hash != r.prompt_hash and other.prompt == r.prompt


# -- the reward stage with a judge reward ----------------------------------------------------


CALL = [(start(), 0), (step(seq=0), 1), (end(step_count=1), 2)]


def judged(function: str = "streams.rewards:judge", **kw: Any) -> Core:
    return Core(rewarder=build_rewarder(function, kw.pop("weights", None)), judge=SPEC, **kw)


def run_call(core: Core) -> None:
    for record, seconds in CALL:
        core.event(record, at(seconds))


def the_verdict(score: float | None = 0.7, call_id: str = "call-1", **kw: Any) -> JudgeVerdict:
    fields: dict[str, Any] = {
        "call_id": call_id,
        "trajectory_id": call_id,
        "judge_model": "judge-1",
        "prompt_hash": "h" * 64,
        "requested_at": at(2),
        "judged_at": at(3),
        "score": score,
        "error": None if score is not None else "garbage answer: not JSON",
    }
    fields.update(kw)
    return JudgeVerdict(**fields)


def rewards(core: Core) -> list[float]:
    return [r.reward for r in core.topic("rewarded") if isinstance(r, RewardedTrajectory)]


def test_a_judge_reward_without_the_judge_settings_fails_at_start() -> None:
    with pytest.raises(ConfigError, match=r"reward\.judge\.url"):
        RewardJoin(
            build_rewarder("streams.rewards:judge"),
            awaiting=Core().awaiting,
            codec=CODEC,
            feedback_grace=timedelta(0),
            abandon_after=timedelta(60),
            score_incomplete=False,
        )
    assert "reward.judge.rubric_file" in NO_JUDGE


def test_one_request_per_call_then_the_verdict_scores() -> None:
    core = judged()
    run_call(core)
    [req] = core.topic("judge_requests")
    assert isinstance(req, JudgeRequest)
    assert (req.call_id, req.model, req.requested_at) == ("call-1", "judge-1", at(2))
    assert rewards(core) == []
    # feedback for it: no second request
    core.feedback(feedback(), at(3))
    assert len(core.topic("judge_requests")) == 1
    # the trajectory redelivered (a crash before the offset commit, which may have lost the
    # request): the same request again, whose second answer the first verdict rule dedupes
    [traj] = core.topic("trajectories")
    core.trajectory(traj, at(3))
    assert core.topic("judge_requests") == [req, req]
    out = core.verdict(the_verdict(0.7), at(4))
    assert rewards(core) == [0.7] and out.stats["verdicts.stored"] == 1
    assert core.awaiting.get(b"call-1") is None


def test_a_stored_verdict_is_reused_by_a_redelivered_trajectory() -> None:
    core = judged()
    run_call(core)
    core.verdict(the_verdict(0.7), at(4))
    [traj] = core.topic("trajectories")
    core.trajectory(traj, at(5))  # after it was scored: scored again alike, nothing asked
    assert rewards(core) == [0.7, 0.7]
    assert len(core.topic("judge_requests")) == 1


def test_a_verdict_before_the_trajectory_means_no_request() -> None:
    """As in replay, which reads the verdicts first."""
    core = judged()
    core.verdict(the_verdict(0.4), at(0))
    run_call(core)
    assert core.topic("judge_requests") == [] and rewards(core) == [0.4]


def test_the_first_verdict_wins_and_is_made_the_last_on_the_topic() -> None:
    core = judged()
    run_call(core)
    first = the_verdict(0.7)
    core.verdict(first, at(4))
    out = core.verdict(first, at(5))  # the same again (a redelivery): nothing to do
    assert out.stats["verdicts.duplicate"] == 1 and out.emits == []
    out = core.verdict(the_verdict(0.1, judged_at=at(6)), at(6))  # asked twice after a crash
    assert out.stats["verdicts.conflict"] == 1
    assert [(e.topic, e.key, e.record) for e in out.emits] == [("verdicts", b"call-1", first)]
    assert rewards(core) == [0.7]
    stored = CODEC.decode_as(core.verdicts.get(b"call-1") or b"", StoredVerdict)
    assert stored.verdict == first


def test_a_verdict_without_a_score_is_a_judge_dead_letter_with_its_error() -> None:
    core = judged()
    run_call(core)
    core.verdict(the_verdict(None), at(4))
    assert rewards(core) == []
    [reject] = core.out.rejects
    assert reject.stage == "judge"
    assert reject.reason == "judge verdict without a score: garbage answer: not JSON"
    assert isinstance(CODEC.decode(reject.payload or b""), Trajectory)  # replayable
    assert core.awaiting.get(b"call-1") is None


def test_a_verdict_only_from_the_verdicts_topic() -> None:
    core = judged()
    out = core.feedback(the_verdict(), at(0))
    assert [r.reason for r in out.rejects] == [
        "io.trajstream.JudgeVerdict does not belong on user-feedback"
    ]


def test_the_judge_in_a_composite() -> None:
    core = judged("composite", weights={"streams.rewards:success": 1, "streams.rewards:judge": 1})
    run_call(core)
    assert len(core.topic("judge_requests")) == 1
    core.verdict(the_verdict(0.5), at(4))
    [r] = core.topic("rewarded")
    assert isinstance(r, RewardedTrajectory)
    assert r.reward == 0.75 and r.components == {"success": 1.0, "judge": 0.5}


def test_with_a_grace_period_the_feedback_is_final_when_the_grace_ends() -> None:
    """The verdict comes after the grace period: feedback that arrived in between is not
    attached, as in a replay, which has the verdict at once and scores when the grace ends."""
    core = judged(
        "composite",
        weights={"streams.rewards:user_rating": 1, "streams.rewards:judge": 1},
        feedback_grace=timedelta(seconds=10),
    )
    run_call(core)  # arrives at 2 s: the grace period ends at 12 s
    core.tick(at(12))
    core.feedback(feedback(rating=5.0), at(13))
    core.verdict(the_verdict(0.5), at(14))
    [r] = core.topic("rewarded")
    assert isinstance(r, RewardedTrajectory)
    assert r.components == {"user_rating": 0.5, "judge": 0.5}  # neutral: no feedback


def test_feedback_in_the_grace_period_and_then_the_verdict() -> None:
    core = judged(
        "composite",
        weights={"streams.rewards:user_rating": 1, "streams.rewards:judge": 1},
        feedback_grace=timedelta(seconds=10),
    )
    run_call(core)
    core.feedback(feedback(rating=5.0), at(5))
    assert rewards(core) == []  # ready, waiting for the verdict
    core.tick(at(30))
    assert rewards(core) == []
    core.verdict(the_verdict(0.5), at(31))
    [r] = core.topic("rewarded")
    assert isinstance(r, RewardedTrajectory) and r.components["user_rating"] == 1.0


def test_stored_verdicts_are_forgotten_after_their_retention() -> None:
    core = judged(verdict_retention=timedelta(seconds=100))
    run_call(core)
    core.verdict(the_verdict(0.7), at(4))
    core.tick(at(103))
    assert core.verdicts.get(b"call-1") is not None
    out = core.tick(at(104))
    assert out.stats["verdicts.forgotten"] == 1 and core.verdicts.get(b"call-1") is None


def test_a_verdict_still_awaited_is_not_forgotten() -> None:
    core = judged(
        "composite",
        weights={"streams.rewards:user_rating": 1, "streams.rewards:judge": 1},
        feedback_grace=timedelta(seconds=500),
        verdict_retention=timedelta(seconds=100),
    )
    core.verdict(the_verdict(0.7), at(0))
    run_call(core)  # waits for feedback until 502 s
    core.tick(at(200))
    assert core.verdicts.get(b"call-1") is not None
    core.tick(at(502))
    assert rewards(core) == [0.35 + 0.25]


def test_the_deadline_indexes_are_rebuilt_after_a_restart() -> None:
    core = judged(verdict_retention=timedelta(seconds=100))
    run_call(core)
    core.verdict(the_verdict(0.7), at(4))
    core.join.reset()  # a rebalance: indexes rebuilt from the stores
    assert core.tick(at(104)).stats["verdicts.forgotten"] == 1


def test_a_worker_without_the_judge_scores_what_waited_for_a_verdict() -> None:
    """The reward function changed from a judge reward to another one across a restart: the
    trajectories that waited for a verdict are scored by the new one, not kept forever."""
    core = judged()
    run_call(core)
    assert rewards(core) == []
    after = Core()  # streams.rewards:success, no judge
    after.awaiting.data.update(core.awaiting.data)
    after.tick(at(5))
    assert rewards(after) == [1.0]


def test_only_verdicts_on_the_verdicts_topic() -> None:
    """No user feedback (nor anything else) enters through the verdicts topic."""
    core = judged()
    out = core.verdict(feedback(rating=5.0), at(0))
    assert [(r.stage, r.reason) for r in out.rejects] == [
        ("reward", "io.trajstream.UserFeedback does not belong on verdicts")
    ]
    assert core.awaiting.get(b"call-1") is None


def test_a_tombstone_on_the_verdicts_topic_forgets_the_verdict() -> None:
    from streams.core.effects import Source

    core = judged()
    core.verdict(the_verdict(0.7), at(0))
    out = core.join.on_record(EDGE.read(Source("verdicts", 0, 9, b"call-1", b"")), at(1))
    assert out.stats["verdicts.deleted"] == 1 and out.rejects == []
    assert core.verdicts.get(b"call-1") is None
    run_call(core)
    assert len(core.topic("judge_requests")) == 1  # judged again


def test_the_judge_stage_asks_its_port_once_per_call_or_declines() -> None:
    """The one judge stage of both runners: each request through the port once per process
    (a request made again is skipped), a verdict on ``verdicts``; declining asks no one and
    answers without a score; a record that is no request is a judge dead letter."""
    import asyncio

    from streams.core.judge import JudgeSpec, JudgeStage

    request = JudgeSpec("j", "Score.").request(trajectory(), at(0))
    asked: list[str] = []

    async def port(r: JudgeRequest) -> JudgeVerdict:
        asked.append(r.call_id)
        return the_verdict(0.7)

    stage = JudgeStage()
    env = EDGE.open("p.judge-requests", 0, 1, b"call-1", CODEC.encode(request))
    first = asyncio.run(stage.on_record(env, port, lambda: at(1)))
    again = asyncio.run(stage.on_record(env, port, lambda: at(2)))
    assert asked == ["call-1"] and first.records("verdicts") == [the_verdict(0.7)]
    assert again.emits == [] and again.stats["judge.skipped"] == 1
    declined = asyncio.run(JudgeStage(decline="not asked").on_record(env, port, lambda: at(3)))
    [verdict] = declined.records("verdicts")
    assert asked == ["call-1"] and verdict.error == "not asked"  # type: ignore[attr-defined]
    garbage = EDGE.open("p.judge-requests", 0, 2, b"call-1", b"not avro")
    bad = asyncio.run(stage.on_record(garbage, port, lambda: at(4)))
    assert [r.stage for r in bad.rejects] == ["judge"] and bad.rejects[0].source is not None
