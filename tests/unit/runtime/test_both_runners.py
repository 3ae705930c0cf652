"""One table of cases through both runners: the live worker's objects (composed over in-memory
stores and topics and a clock the test moves) and replay's runner.
Both must give the same decisions, trajectories, rewards, feedback requests (and the
acknowledgements for the ledger), judge requests, commits (the live ledger agent's and a
backfill's, from the same acknowledgements at the same times) and rejects with the same
reasons: they run one core, and only the clock's source differs."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from streams.codec import SchemaRegistry
from streams.core.backfill import Backfill, backfill_config, plan_feedback
from streams.core.feedback import FeedbackRequest, deliver
from streams.core.judge import JudgeStage
from streams.devtools.standin import judge_score
from streams.io.judge import JudgeClient, judge_port
from streams.models import (
    AvroModel,
    CommitRecord,
    DeadLetter,
    FeedbackAck,
    JudgeRequest,
    JudgeVerdict,
    LedgerState,
    RewardedTrajectory,
    SelectionDecision,
    StepKind,
    Tick,
    Trajectory,
)
from streams.runtime.config import ledger_config_of
from streams.runtime.live.app import Rules
from streams.runtime.replay import END_OF_TIME, ReplayRunner, SourceRecord
from streams.settings import Settings, load_settings
from streams.topics import Topics
from tests.unit.core.harness import REPO_ROOT, ScriptedTrinity, m
from tests.unit.factories import at, end, feedback, start, step
from tests.unit.runtime.live.memory import Event, stages

CODEC = SchemaRegistry.default()
Answer = tuple[str, float | None, str | None, str, str, int]
Row = tuple[float, str, AvroModel, bytes | None]  # seconds after T0, kind, record, key override


def call(call_id: str, t: float = 0, steps: int = 1, **step_kw: Any) -> list[Row]:
    rows: list[Row] = [(t, "event", start(call_id), None)]
    rows += [(t + 1 + i / 10, "event", step(call_id, i, **step_kw), None) for i in range(steps)]
    rows.append((t + 2, "event", end(call_id, step_count=steps), None))
    return rows


CASES: dict[str, tuple[dict[str, Any], list[Row], float]] = {
    # name: (settings, rows, end of the range in seconds)
    "complete calls": ({}, call("c1") + call("c2", 3, steps=3), 10),
    "abandoned": ({}, call("c1")[:2] + call("c2", 100), 110),
    "abandoned, scored": (
        {"reward": {"score_incomplete": True}},
        call("c1")[:2] + call("c2", 100),
        110,
    ),
    "late event": ({}, [*call("c1"), (5, "event", step("c1", 0), None)], 10),
    "nothing trainable": ({}, call("c1", kind=StepKind.TOOL), 10),
    "wrong key": ({}, [(0, "event", start("c1"), b"other"), *call("c2", 1)], 10),
    "reused seq": (
        {},
        [*call("c1")[:2], (1.5, "event", step("c1", 0, event_id="x"), None), *call("c1")[2:]],
        10,
    ),
    "feedback in the grace period": (
        {"reward": {"function": "streams.rewards:user_rating", "feedback_grace_s": 10}},
        [*call("c1"), (5, "feedback", feedback("c1", rating=5.0), None), *call("c2", 6)],
        40,
    ),
    "feedback before its trajectory, and none": (
        {"reward": {"function": "streams.rewards:user_rating", "feedback_grace_s": 10}},
        [(0.5, "feedback", feedback("c1", rating=1.0), None), *call("c1"), *call("c2", 3)],
        40,
    ),
    "per-step rewards by discount": (
        {"reward": {"step_discount": 0.5}},
        call("c1", steps=3) + call("c2", 3, steps=1),
        10,
    ),
    "per-step rewards from the function": (
        {"reward": {"function": "tests.unit.core.test_step_rewards:first_steps_half"}},
        call("c1", steps=3),
        10,
    ),
    "a tick on the feedback topic": (
        {},
        [*call("c1"), (5, "feedback", Tick(at=at(900)), b"c1")],
        10,
    ),
    # the stand-in's judge answers; call "c2" gets a garbage answer: a judge dead letter
    "judge reward, and a garbage answer": (
        {"reward": {"function": "streams.rewards:judge"}},
        call("c1") + call("c2", 3) + call("c3", 6, steps=2),
        20,
    ),
    "judge in a composite, with feedback in the grace period": (
        {
            "reward": {
                "function": "composite",
                "weights": {"streams.rewards:user_rating": 1, "streams.rewards:judge": 1},
                "feedback_grace_s": 10,
            }
        },
        [*call("c1"), (5, "feedback", feedback("c1", rating=5.0), None), *call("c3", 6)],
        40,
    ),
}

RUBRIC = str(REPO_ROOT / "examples" / "judge-rubric.txt")


def fake_judge() -> JudgeClient:
    """The stand-in judge's answers without a server: a score from the prompt's hash, and a
    garbage answer for call c2."""

    def answer(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["messages"][-1]["content"]
        if request.headers["x-trajstream-call-id"] == "c2":
            content = "Looks great!"
        else:
            content = json.dumps({"score": judge_score(prompt), "reason": "hash"})
        return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})

    return JudgeClient("http://judge.test/v1", transport=httpx.MockTransport(answer))


def settings_for(overrides: dict[str, Any]) -> Settings:
    base: dict[str, Any] = {
        "selection": {"strategy": "sampling:1"},
        "reward": {"judge": {"url": "http://judge.test/v1", "model": "j", "rubric_file": RUBRIC}},
        "assembly": {"abandon_after_s": 60, "late_retention_s": 900},
        "observe": {"port": 0},  # no metrics server in a unit test
    }
    for section, values in overrides.items():
        base.setdefault(section, {}).update(values)
    if "judge" not in str(base["reward"].get("function", "")) + str(base["reward"].get("weights")):
        base["reward"].pop("judge")  # the other cases run without the judge settings
    return load_settings(**base)


@dataclass
class Result:
    decisions: list[SelectionDecision]
    trajectories: list[Trajectory]
    rewards: list[RewardedTrajectory]
    feedback: list[tuple[list[str], float]]
    rejects: list[tuple[str, str]]
    acks: list[tuple[str, int, int]]
    """(trajectory, attempts, requests) of each FeedbackAck for the ledger."""
    judge_requests: list[JudgeRequest]
    """Without requested_at: the live stage dates them by its clock, replay by record time."""
    ack_records: list[FeedbackAck]
    verdicts: list[Answer]
    """What the judge stage answered, by call: score, error, prompt hash, raw answer, attempts
    (not its dates: each runner's clock)."""
    direct: int = -1
    """Live only: the trajectories the assemble stage fed back itself (no hop)."""


class FeedbackTrinity(ScriptedTrinity):
    def __init__(self) -> None:
        super().__init__([m(0, 0)] * 10)
        self.feedbacks: list[tuple[list[str], float]] = []

    async def feedback(self, msg_ids: list[str], reward: float, *args: Any) -> dict[str, Any]:
        self.feedbacks.append((list(msg_ids), reward))
        return {"status": "success"}

    async def aclose(self) -> None:
        pass


def run_live(settings: Settings, rows: list[Row], until: float) -> Result:
    trinity = FeedbackTrinity()
    w = stages(settings, trinity=trinity, judge_client=fake_judge)
    s, t = w.stages, Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    offsets = iter(range(10**6))

    async def drain(done: int) -> int:
        # hand what a stage sent on to the next one, as the topics would
        while done < len(w.sent):
            sent = w.sent[done]
            done += 1
            if sent.handled:
                continue  # the assemble stage took it through the next stage (.assembling)
            event = Event(getattr(t, sent.topic), next(offsets), sent.key, sent.value)
            if sent.topic in ("trajectories", "verdicts"):
                await s.guard.handle("reward", event, s.reward)
            elif sent.topic == "rewarded":
                await s.feedback.handle(event)
            elif sent.topic == "judge_requests":
                assert s.judge is not None
                await s.judge.handle(event)
        return done

    async def tick(now: datetime, *, reward_only: bool = False) -> None:
        value = CODEC.encode(Tick(at=now))
        if not reward_only:
            await s.assemble.run([Event(t.ticks, next(offsets), None, value)])
        await s.guard.handle("reward", Event(t.ticks, next(offsets), None, value), s.reward)

    async def main() -> None:
        done = 0
        for seconds, kind, record, key in rows:
            w.clock.now = at(seconds)
            await tick(at(seconds))  # replay: every record is also a tick of its partition
            done = await drain(done)
            topic = t.agent_events if kind == "event" else t.user_feedback
            key = key if key is not None else getattr(record, "call_id", "").encode()
            event = Event(topic, next(offsets), key, CODEC.encode(record))
            if kind == "event":
                await s.assemble.run([event])
            else:
                await s.guard.handle("reward", event, s.reward)
            done = await drain(done)
        w.clock.now = at(until)
        await tick(at(until))
        done = await drain(done)
        # replay ends every grace period still running (straight to the stage, as replay does:
        # no tick record may be dated that far ahead of the clock)
        await s.sink.dispatch(s.reward.on_tick(0, END_OF_TIME))
        await drain(done)

    asyncio.run(main())

    letters = [
        d for d in w.records("dead_letters") + w.records("late_events") if isinstance(d, DeadLetter)
    ]
    return Result(
        w.records("decisions"),
        w.records("trajectories"),
        w.records("rewarded"),
        trinity.feedbacks,
        sorted((d.stage, d.reason) for d in letters),
        [(a.rewarded.trajectory_id, a.attempts, a.feedbacks) for a in w.records("ledger")],
        [_undated(r) for r in w.records("judge_requests")],
        w.records("ledger"),
        _verdicts(w.records("verdicts")),
        w.stats["feedback.direct"],
    )


def _undated(request: JudgeRequest) -> JudgeRequest:
    return request.model_copy(update={"requested_at": at(0)})


def _verdicts(verdicts: list[JudgeVerdict]) -> list[Answer]:
    return sorted(
        (v.call_id, v.score, v.error, v.prompt_hash, v.raw_answer, v.attempts) for v in verdicts
    )


def run_replay(settings: Settings, rows: list[Row], until: float) -> Result:
    rules = Rules.of(settings)  # the same strategy, rewarder, limits as the live worker's
    runner = ReplayRunner(
        rules.strategy,
        [rules.rewarder],
        limits=rules.limits,
        feedback_grace=timedelta(seconds=settings.reward.feedback_grace_s),
        score_incomplete=settings.reward.score_incomplete,
        late_retention=timedelta(seconds=settings.assembly.late_retention_s),
        topics=Topics(settings.kafka.topic_prefix, settings.kafka.partitions),
        judge=rules.judge,
    )
    for offset, (seconds, kind, record, key) in enumerate(rows):
        key = key if key is not None else getattr(record, "call_id", "").encode()
        runner.feed(SourceRecord(kind, 0, offset, at(seconds), key, CODEC.encode(record)))  # type: ignore[arg-type]
    runner.finish(at(until))
    judge_requested = list(runner.judge_requests.values())
    verdicts: list[JudgeVerdict] = []
    if runner.judge_requests:  # as run_replay asks for the calls without a stored verdict:
        # the same judge stage, over the same port as the live worker's (the stand-in's answers)
        client = fake_judge()
        port = judge_port(lambda: client, rules.judge_policy, clock=lambda: at(until))
        verdicts = asyncio.run(runner.judge(JudgeStage(), port, lambda: at(until)))
        assert runner.stats["judge.asked"] == len(judge_requested)
    rewards = [r for _, r in runner.scored()]
    sent: list[tuple[list[str], float]] = []

    async def send(request: FeedbackRequest, what: str) -> int:  # replay's send, one attempt
        sent.append((request.msg_ids, request.reward))
        return 1

    async def deliver_all() -> list[FeedbackAck]:
        # what send_to_trinity does for each planned trajectory
        planned = plan_feedback(rewards, set()).send
        return [await deliver(r, send, lambda: at(until)) for r in planned]

    acks = asyncio.run(deliver_all())
    return Result(
        runner.decisions,
        [o.trajectory for o in runner.outcomes],
        rewards,
        sent,
        sorted((r.stage, r.reason) for r in runner.rejects),
        [(a.rewarded.trajectory_id, a.attempts, a.feedbacks) for a in acks],
        [_undated(r) for r in judge_requested],
        acks,
        _verdicts(verdicts),
    )


@pytest.mark.parametrize("case", list(CASES))
def test_both_runners_decide_alike(case: str) -> None:
    overrides, rows, until = CASES[case]
    settings = settings_for(overrides)
    mine, theirs = run_live(settings, rows, until), run_replay(settings, rows, until)
    assert mine.decisions == theirs.decisions
    assert mine.trajectories == theirs.trajectories
    assert mine.rewards == theirs.rewards
    assert mine.feedback == theirs.feedback
    assert mine.rejects == theirs.rejects
    assert mine.acks == theirs.acks
    assert mine.judge_requests == theirs.judge_requests
    assert mine.verdicts == theirs.verdicts
    assert mine.decisions  # every case closes something
    # the common case (no judge, no grace period) is fed back by the stage that closed the call
    waits = settings.reward.feedback_grace_s > 0 or "judge" in case
    assert (mine.direct == len(mine.acks)) != waits or not mine.acks
    acks = [CODEC.encode(a) for a in theirs.ack_records]
    assert live_commits(settings, acks) == backfill_commits(settings, acks)


# the acknowledgements reach the ledger this many seconds apart (the default interval is 300 s),
# and the end comes in an interval of its own: both runners commit what is left there
ACK_EVERY_S, END_AFTER_S = 310.0, 400.0


def ledger_trinity() -> ScriptedTrinity:
    return ScriptedTrinity([m(i, 5 * (i + 1)) for i in range(40)])


def live_commits(settings: Settings, acks: list[bytes]) -> list[CommitRecord]:
    """The live ledger agent's commits: each acknowledgement a batch of ``<p>.ledger`` at its
    time, then a final tick (a graceful stop)."""
    w = stages(settings, trinity=ledger_trinity())
    ledger = Topics(settings.kafka.topic_prefix, settings.kafka.partitions).ledger

    async def main() -> None:
        for i, value in enumerate(acks):
            w.clock.now = at(i * ACK_EVERY_S)
            await w.stages.ledger.on_batch([Event(ledger, i, b"k", value)])
        w.clock.now = at(len(acks) * ACK_EVERY_S + END_AFTER_S)
        final = CODEC.encode(Tick(at=w.clock.now, final=True))
        await w.stages.ledger.on_batch([Event(ledger, len(acks), None, final)])

    asyncio.run(main())
    return w.records("commits")


def backfill_commits(settings: Settings, acks: list[bytes]) -> list[CommitRecord]:
    """A backfill's commits (what ``trajstream replay --to trinity`` records on
    ``<p>.replayed``) of the same acknowledgements at the same times, then the end."""
    clock = {"now": at(0)}

    class Port:
        trinity = ledger_trinity()

        async def write_ahead(self, state: LedgerState) -> None:
            pass

        async def recorded(self, record: CommitRecord, state: LedgerState) -> None:
            pass

    cfg = backfill_config(ledger_config_of(settings), None, settings.commit.interval_s)
    backfill = Backfill(cfg, Port(), codec=CODEC, state=None, clock=lambda: clock["now"])

    async def main() -> None:
        await backfill.resume()
        for i, value in enumerate(acks):
            clock["now"] = at(i * ACK_EVERY_S)
            await backfill.acked(CODEC.decode_as(value, FeedbackAck))
        clock["now"] = at(len(acks) * ACK_EVERY_S + END_AFTER_S)
        await backfill.close()

    asyncio.run(main())
    return backfill.records


def test_the_cases_cover_what_matters() -> None:
    """The table is not vacuous: between them the cases reject, abandon, wait and score."""
    results = [run_replay(settings_for(o), rows, until) for o, rows, until in CASES.values()]
    stages = {stage for r in results for stage, _ in r.rejects}
    assert {"assemble", "reward", "late", "judge"} <= stages
    assert any(t.reward_fn == "streams.rewards:judge" for r in results for t in r.rewards)
    assert any(d.closed_reason.startswith("abandoned") for r in results for d in r.decisions)
    assert any(fb for r in results for t in r.rewards for fb in [t.reward != 0.5])
    assert any(len(r.feedback) > len(r.rewards) for r in results)  # per-step requests
    assert any(r.judge_requests for r in results)
    scored = [v for r in results for v in r.verdicts]
    assert any(v[1] is not None for v in scored) and any(v[2] is not None for v in scored)
    assert any(requests > 1 for r in results for _, _, requests in r.acks)
    # between them the cases commit when an interval ends (more than one feedback) and at the end
    commits = [
        r
        for (o, _, _), result in zip(CASES.values(), results, strict=True)
        for r in backfill_commits(settings_for(o), [CODEC.encode(a) for a in result.ack_records])
    ]
    assert any(r.final for r in commits)
    assert any(not r.final and r.feedback_count > 1 and r.sent for r in commits)
