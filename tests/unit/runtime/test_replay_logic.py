"""Unit tests of the pure half of streams.runtime.replay: the replay core, statistics, the feedback
plan, commit pacing, the replay id and the parsing of the command line's range.

The core must decide exactly like the live stages: the expected trajectories are built with
the same pure functions the live assemble stage calls (streams.core.assembly), event by event.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streams.codec import SchemaRegistry
from streams.core.assembly import Limits, add_event, close, new_pending
from streams.core.backfill import Backfill, backfill_config
from streams.core.ledger import CommitPlan, LedgerConfig
from streams.core.rewards import Rewarder, build_rewarder, success, user_rating
from streams.core.select import SamplingRate, build_strategy
from streams.envelope import Edge
from streams.errors import ConfigError, ReplayError, TrinityUnavailable
from streams.export.redact import Redactor
from streams.models import (
    AgentCall,
    CallStatus,
    ChatMessage,
    CommitRecord,
    Completion,
    FeedbackKind,
    LedgerState,
    RewardedTrajectory,
    StepKind,
    Tick,
    Trajectory,
    UserFeedback,
)
from streams.runtime.replay import (
    Distribution,
    Outcome,
    ReplayCore,
    ReplayOptions,
    SourceRecord,
    build_exports,
    compare,
    parse_offsets,
    parse_time,
    plan_feedback,
    replay_id,
)
from streams.runtime.replay_runner import FREEZE_EVERY
from tests.unit.core.harness import ScriptedTrinity, m
from tests.unit.factories import T0, ack, at, end, feedback, mark, rewarded, start, step

CODEC = SchemaRegistry.default()
ALL = SamplingRate(1.0)
LIMITS = Limits(max_steps=50, max_bytes=1_000_000, abandon_after=timedelta(minutes=10))


def rec(
    event: Any, seconds: float, *, partition: int = 0, offset: int = 0, key: bytes | None = None
) -> SourceRecord:
    """One Kafka record of ``event``, written ``seconds`` after T0."""
    kind = "feedback" if isinstance(event, UserFeedback) else "event"
    return SourceRecord(
        kind,
        partition,
        offset,
        at(seconds),
        key if key is not None else event.call_id.encode(),
        CODEC.encode(event),
    )


def call_events(
    call_id: str, steps: int = 3, *, status: CallStatus = CallStatus.OK, **end_fields: Any
) -> list[AgentCall | Completion]:
    events: list[AgentCall | Completion] = [start(call_id)]
    for seq in range(steps):
        kind = StepKind.TOOL if seq % 2 else StepKind.LLM
        events.append(step(call_id, seq, kind=kind))
    events.append(end(call_id, step_count=steps, status=status, **end_fields))
    return events


def records(
    events: Iterable[Any], *, t: float = 0.0, dt: float = 0.1, partition: int = 0
) -> list[SourceRecord]:
    return [rec(e, t + i * dt, partition=partition, offset=i) for i, e in enumerate(events)]


def live_trajectory(events: Sequence[AgentCall | Completion], strategy: Any = ALL) -> Trajectory:
    """What the live assemble stage builds: the join functions applied in arrival order."""
    state = new_pending(events[0].call_id, T0)
    for e in events:
        add_event(state, e, len(CODEC.encode(e)))
    _, trajectory = close(state, strategy, "ended")
    assert trajectory is not None
    return trajectory


def core(*rewarders: Rewarder, **kw: Any) -> ReplayCore:
    kw.setdefault("limits", LIMITS)
    return ReplayCore(kw.pop("strategy", ALL), list(rewarders) or [Rewarder(success)], **kw)


# -- the assemble stage ------------------------------------------------------------------------


def test_in_order_events_give_the_live_trajectory_and_reward() -> None:
    events = call_events("c1", status=CallStatus.ERROR, error_type="Boom")
    c = core()
    c.feed_all(records(events))
    c.finish()
    [o] = c.outcomes
    expected = live_trajectory(events)
    assert o.trajectory == expected
    assert o.rewards[0] == Rewarder(success)(expected)
    assert o.rewards[0] is not None and o.rewards[0].reward == 0.0
    assert c.stats["calls.selected"] == 1 and c.stats["rewarded.0"] == 1


def test_out_of_order_and_duplicate_events_give_the_same_trajectory() -> None:
    events = call_events("c1", steps=4)
    shuffled = [
        events[-1],
        events[3],
        events[1],
        events[3],
        events[0],
        events[2],
        events[1],
        events[4],
    ]  # the END first, steps backwards, duplicates of two steps
    c = core()
    c.feed_all(records(shuffled))
    c.finish()
    [o] = c.outcomes
    assert o.trajectory == live_trajectory(shuffled)
    assert [s.seq for s in o.trajectory.steps] == [0, 1, 2, 3]
    assert o.trajectory.input_messages == events[0].input_messages  # the START arrived late
    assert c.stats["events.duplicate"] == 2


def test_many_interleaved_calls_across_partitions_match_the_live_logic() -> None:
    rng = random.Random(5)
    calls = {
        f"call-{i}": call_events(
            f"call-{i}", steps=rng.randint(0, 4), status=rng.choice(list(CallStatus))
        )
        for i in range(40)
    }
    strategy = build_strategy("sampling:0.5")
    per_partition: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    for i, events in enumerate(calls.values()):
        per_partition[i % 3].append(list(events))
    feed: list[SourceRecord] = []
    for partition, queues in per_partition.items():
        t = 0.0
        while any(queues):  # interleave the calls of a partition at random, each in order
            q = rng.choice([q for q in queues if q])
            feed.append(rec(q.pop(0), t, partition=partition))
            t += 0.01
    c = core(strategy=strategy)
    c.feed_all(feed)
    c.finish()
    expected = {}
    for call_id, events in calls.items():
        _, trajectory = close(_state(events), strategy, "ended")
        if trajectory is not None:
            expected[call_id] = trajectory
    assert 5 < len(expected) < 35
    assert {o.call_id: o.trajectory for o in c.outcomes} == expected
    assert c.stats["calls.closed"] == 40
    assert c.stats["calls.selected"] + c.stats["calls.not_selected"] == 40
    assert not c.incomplete


def _state(events: Sequence[AgentCall | Completion]) -> Any:
    state = new_pending(events[0].call_id, T0)
    for e in events:
        add_event(state, e, len(CODEC.encode(e)))
    return state


def test_a_not_selected_call_gives_no_outcome_but_is_counted() -> None:
    c = core(strategy=SamplingRate(0.0))
    c.feed_all(records(call_events("c1")))
    c.finish()
    assert c.outcomes == []
    assert c.stats["calls.not_selected"] == 1
    assert c.reasons == {"not-sampled": 1}


def test_an_event_after_its_call_closed_is_late_and_changes_nothing() -> None:
    events = call_events("c1", steps=1)
    late = step("c1", 1, event_id="late-step")
    c = core()
    c.feed_all(records([*events, late]))
    c.finish()
    [o] = c.outcomes
    assert len(o.trajectory.steps) == 1
    assert c.stats["events.late"] == 1


def test_a_call_without_its_end_is_abandoned_when_its_partition_clock_passes_the_timeout() -> None:
    c = core()
    c.feed_all(records(call_events("c1")[:-1], t=0))  # no END
    c.feed(rec(start("c2"), 601, partition=0))  # the clock of partition 0 moves on
    c.feed(rec(start("c3"), 700, partition=1))  # another partition's clock does not count
    c.finish()
    [o] = c.outcomes
    assert o.trajectory.closed_reason == "abandoned: no end event"
    assert o.unscored == "abandoned: no end event" and o.rewards == [None]
    assert c.stats["trajectories.incomplete"] == 1
    assert c.incomplete == ["c2", "c3"]  # still open at the end of the range: reported


def test_finish_moves_the_clocks_to_the_end_of_the_range() -> None:
    c = core(score_incomplete=True)
    c.feed_all(records(call_events("c1")[:-1]))
    c.finish(until=at(3600))
    [o] = c.outcomes
    assert o.trajectory.closed_reason.startswith("abandoned")
    assert o.rewards[0] is not None  # score_incomplete: scored like the live stage would
    assert c.incomplete == []


def test_an_oversized_call_closes_at_once() -> None:
    c = core(limits=Limits(max_steps=2, max_bytes=10**6, abandon_after=timedelta(minutes=10)))
    c.feed_all(records(call_events("c1", steps=5)[:4]))
    c.finish()
    [o] = c.outcomes
    assert o.trajectory.closed_reason == "oversized: more than 2 steps"
    assert c.stats["calls.closed_oversized"] == 1


def test_calls_that_close_before_since_are_context_only() -> None:
    c = core(since=at(50))
    c.feed_all(records(call_events("early"), t=0))
    c.feed_all(records(call_events("straddles")[:2], t=40))
    c.feed_all(records(call_events("straddles")[2:], t=55))
    c.finish()
    assert [o.call_id for o in c.outcomes] == ["straddles"]
    assert c.outcomes[0].trajectory.input_messages  # its START (before since) was read
    assert c.stats["calls.before_range"] == 1


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (SourceRecord("event", 0, 0, T0, b"k", b"not avro"), "single-object"),
        (SourceRecord("event", 0, 0, T0, b"c1", CODEC.encode(Tick(at=T0))), "does not belong"),
        (SourceRecord("feedback", 0, 0, T0, b"c1", CODEC.encode(start("c1"))), "does not belong"),
        (rec(start("c1"), 0, key=b"other"), "is not its call_id"),
        (rec(feedback("c1"), 0, key=b""), "is not its call_id"),
    ],
    ids=["garbage", "tick-on-events", "event-on-feedback", "wrong-key", "feedback-no-key"],
)
def test_bad_records_are_counted_with_their_reason_never_a_crash(
    record: SourceRecord, reason: str
) -> None:
    c = core()
    c.feed(record)
    c.feed_all(records(call_events("c2"), t=1))
    c.finish()
    assert c.stats["records.invalid"] == 1
    assert any(reason in why for why in c.invalid)
    assert [o.call_id for o in c.outcomes] == ["c2"]


def test_a_reward_function_that_fails_is_an_error_not_a_reward() -> None:
    def broken(t: Trajectory) -> float:
        raise ValueError("no")

    c = core(Rewarder(broken, name="broken"))
    c.feed_all(records(call_events("c1")))
    c.finish()
    [o] = c.outcomes
    assert o.rewards == [None]
    assert o.errors[0] is not None and "ValueError" in o.errors[0]
    assert c.stats["reward_errors.0"] == 1 and c.scored() == []


# -- the reward stage: user feedback -----------------------------------------------------------


def rating(call_id: str, value: float, n: int = 0) -> UserFeedback:
    return feedback(call_id, event_id=f"{call_id}/fb/{n}", rating=value)


@pytest.mark.parametrize(
    ("feedback_at", "grace", "expected"),
    [
        (2.0, 5.0, 0.75),  # within the grace period: attached
        (9.0, 5.0, 0.5),  # after it: scored neutral without it
        (2.0, 0.0, 0.5),  # no grace period: scored at once
        (0.05, 0.0, 0.75),  # arrived before the call closed: attached
    ],
)
def test_a_reward_that_wants_feedback_waits_up_to_the_grace_period(
    feedback_at: float, grace: float, expected: float
) -> None:
    events = call_events("c1", steps=1)
    feed = records(events, t=0, dt=0.1)  # closes at 0.2
    feed.append(rec(rating("c1", 4.0), feedback_at))
    feed.sort(key=lambda r: r.timestamp)
    feed.append(rec(start("other"), 20))  # the partition's clock moves past every deadline
    c = core(Rewarder(user_rating), feedback_grace=timedelta(seconds=grace))
    c.feed_all(feed)
    c.finish()
    [o] = c.outcomes
    assert o.rewards[0] is not None and o.rewards[0].reward == expected
    assert len(o.attached[0]) == (1 if expected != 0.5 else 0)
    assert len(o.feedback) == 1  # the export sees every feedback of the call either way


def test_only_the_first_feedback_in_the_grace_period_is_used_and_duplicates_count_once() -> None:
    c = core(Rewarder(user_rating), feedback_grace=timedelta(seconds=10))
    c.feed_all(records(call_events("c1", steps=1)))
    c.feed(rec(rating("c1", 5.0, 1), 1))
    c.feed(rec(rating("c1", 5.0, 1), 1.5))  # redelivered
    c.feed(rec(rating("c1", 1.0, 2), 2))
    c.finish()
    [o] = c.outcomes
    assert o.rewards[0] is not None and o.rewards[0].reward == 1.0
    assert len(o.feedback) == 2
    assert c.stats["feedback.duplicate"] == 1


def test_a_reward_that_does_not_want_feedback_is_not_delayed() -> None:
    c = core(Rewarder(success), feedback_grace=timedelta(seconds=30))
    c.feed_all(records(call_events("c1", steps=1)))
    [o] = c.outcomes
    assert o.rewards[0] is not None  # scored at the close, before finish()


def test_feedback_for_calls_not_in_the_results_is_unmatched() -> None:
    c = core(strategy=SamplingRate(0.0))
    c.feed_all(records(call_events("c1")))
    c.feed(rec(rating("c1", 3.0), 5))
    c.feed(rec(rating("nobody", 3.0), 6))
    c.finish()
    assert c.stats["feedback.unmatched"] == 2


def test_two_reward_functions_each_get_feedback_by_their_own_rule() -> None:
    c = core(Rewarder(success), Rewarder(user_rating), feedback_grace=timedelta(seconds=5))
    c.feed_all(records(call_events("c1", steps=1)))
    c.feed(rec(rating("c1", 1.0), 1))
    c.finish()
    [o] = c.outcomes
    assert [r.reward for r in o.rewards if r] == [1.0, 0.0]
    assert o.attached == [[], [rating("c1", 1.0)]]


def test_feeding_after_finish_is_an_error() -> None:
    c = core()
    c.finish()
    with pytest.raises(RuntimeError):
        c.feed(rec(start("c1"), 0))


# -- statistics and A/B ------------------------------------------------------------------------


def test_distribution() -> None:
    d = Distribution.of([float(x) for x in range(11)])
    assert (d.count, d.mean, d.min, d.p10, d.p50, d.p90, d.max) == (11, 5.0, 0, 1, 5, 9, 10)
    assert d.stdev == pytest.approx(3.3166, abs=1e-4)
    assert Distribution.of([]).count == 0 and Distribution.of([]).mean is None
    one = Distribution.of([0.3])
    assert (one.count, one.mean, one.p50, one.stdev) == (1, 0.3, 0.3, 0.0)


def outcome(call_id: str, *rewards: float | None) -> Outcome:
    t = live_trajectory(call_events(call_id, steps=1))
    rs = [None if r is None else rewarded(call_id, r) for r in rewards]
    return Outcome(t, T0, 0, rs, [None] * len(rs), [[] for _ in rs])


def test_compare_two_reward_functions() -> None:
    outcomes = [
        outcome("a", 1.0, 0.9),
        outcome("b", 0.0, 0.1),
        outcome("c", 1.0, 0.2),
        outcome("d", 0.0, 0.8),
        outcome("e", 1.0, None),
    ]
    c = compare(outcomes, threshold=0.5)
    assert (c.a.count, c.b.count, c.both) == (5, 4, 4)
    assert c.agreement == 0.5
    assert c.only_a == ["c", "e"] and c.only_b == ["d"]
    assert c.pearson == pytest.approx(0.1 / 0.5**0.5)  # cov 0.1, sd 1 and sqrt(0.5)


def test_compare_with_a_constant_side_has_no_correlation() -> None:
    c = compare([outcome("a", 1.0, 1.0), outcome("b", 0.0, 1.0)], threshold=0.5)
    assert c.pearson is None and c.agreement == 0.5


# -- replay id, feedback plan, commits ---------------------------------------------------------


def test_replay_id_is_stable_and_names_what_decides_the_feedback() -> None:
    rid = replay_id("p", "sampling(1)", "streams.rewards:success", "1")
    assert rid == replay_id("p", "sampling(1)", "streams.rewards:success", "1")
    assert len(rid) == 16
    assert rid != replay_id("q", "sampling(1)", "streams.rewards:success", "1")
    assert rid != replay_id("p", "sampling(0.5)", "streams.rewards:success", "1")
    assert rid != replay_id("p", "sampling(1)", "streams.rewards:user_rating", "1")
    assert rid != replay_id("p", "sampling(1)", "streams.rewards:success", "2")


def test_plan_feedback_skips_what_was_acknowledged_and_what_has_no_msg_ids() -> None:
    rs = [
        rewarded("a"),
        rewarded("b"),
        rewarded("c", msg_ids=[]),
        rewarded("d", task_id="ticket:bob@example.com"),
    ]
    plan = plan_feedback(rs, {"b"}, Redactor())
    assert [r.call_id for r in plan.send] == ["a", "d"]
    assert plan.skipped == ["b"]
    assert [c for c, _ in plan.unsendable] == ["c"]
    assert plan.send[1].task_id == "ticket:[EMAIL]"
    assert plan_feedback(rs[3:], set()).send[0].task_id == "ticket:bob@example.com"


class BackfillPort:
    """Trinity from a script, and ``<p>.replayed`` as a list of what was written."""

    def __init__(self, trinity: ScriptedTrinity) -> None:
        self.trinity = trinity
        self.written: list[tuple[str, Any]] = []

    async def write_ahead(self, state: LedgerState) -> None:
        self.written.append(("ledger", state.model_copy(deep=True)))

    async def recorded(self, record: CommitRecord, state: LedgerState) -> None:
        self.written += [("commit", record), ("ledger", state.model_copy(deep=True))]


def backfill(
    every: int | None,
    interval_s: float = 300,
    *,
    state: LedgerState | None = None,
    metrics: list[Any] | None = None,
) -> tuple[Backfill, BackfillPort, dict[str, datetime]]:
    clock = {"now": T0}
    port = BackfillPort(ScriptedTrinity(metrics or [m(i, 10 * (i + 1)) for i in range(40)]))
    cfg = backfill_config(LedgerConfig(), every, interval_s)
    b = Backfill(cfg, port, codec=CODEC, state=state, clock=lambda: clock["now"])
    return b, port, clock


def test_a_backfill_commits_every_n_acknowledged_and_what_is_left_at_the_end() -> None:
    b, port, _ = backfill(every=3)

    async def run() -> None:
        await b.resume()
        for i in range(7):
            await b.acked(ack(f"t{i}", reward=i / 10))
        await b.close()

    asyncio.run(run())
    assert [r.feedback_count for r in b.records] == [3, 3, 1]
    assert all(r.sent for r in b.records) and [r.commit_seq for r in b.records] == [0, 1, 2]
    # the rewards of each commit from the ledger's own statistics
    assert [r.reward_mean for r in b.records] == pytest.approx([0.1, 0.4, 0.6])
    assert [r.reward_max for r in b.records] == pytest.approx([0.2, 0.5, 0.6])
    # each commit written ahead, then recorded, then the state after it
    assert [w for w, _ in port.written] == ["ledger", "commit", "ledger"] * 3
    assert port.written[0][1].pending_commit is not None
    assert port.written[-1][1].pending_commit is None and port.written[-1][1].batch_count == 0
    assert b.state.applied_offset == 6


def test_a_backfill_commits_when_its_interval_ends_and_never_empty() -> None:
    b, _, clock = backfill(every=None, interval_s=10)

    async def run() -> None:
        await b.resume()
        await b.acked(ack("a"))
        clock["now"] = T0 + timedelta(seconds=9.9)
        await b.acked(ack("b"))
        assert not b.records  # the interval the batch started in has not ended
        clock["now"] = T0 + timedelta(seconds=10)
        await b.acked(ack("c"))
        await b.close()
        await b.close()  # nothing left: no empty commit

    asyncio.run(run())
    assert [r.feedback_count for r in b.records] == [3]


def test_a_backfill_resumes_an_interrupted_run() -> None:
    # acknowledged after the last commit, not committed: carried by the next commit
    b, _, _ = backfill(every=10)
    uncommitted = [  # as read from <p>.replayed, opened at the edge
        Edge(CODEC).open("p.replayed", 0, i, None, CODEC.encode(a))
        for i, a in enumerate([ack("x", reward=1.0), ack("y", reward=0.0)])
    ]

    async def resume_then_close(b: Backfill) -> None:
        await b.resume(uncommitted)
        await b.close()

    asyncio.run(resume_then_close(b))
    assert [(r.feedback_count, r.reward_mean) for r in b.records] == [(2, 0.5)]
    # stopped after writing a commit of the same two ahead: resolved from the explore step
    # (advanced: recorded, not sent again), and the two are not counted again
    written = b.state.model_copy(deep=True)
    plan = CommitPlan(
        seq=written.next_seq,
        interval_start=T0,
        interval_end=T0,
        count=2,
        reward_sum=1.0,
        reward_min=0.0,
        reward_max=1.0,
        step_before=4,
    )
    crashed = written.model_copy(update={"pending_commit": plan, "batch_count": 2})
    b, _, _ = backfill(every=10, state=crashed, metrics=[m(5, 30)])
    asyncio.run(resume_then_close(b))
    [record] = b.records
    assert "recovered" in record.trinity_response and record.commit_seq == plan.seq
    assert b.port.trinity.calls == ["metrics"]  # type: ignore[attr-defined]


def test_a_backfill_that_trinity_fails_stops_with_a_replay_error() -> None:
    b, _, _ = backfill(every=1, metrics=[TrinityUnavailable("503")])

    async def run() -> None:
        await b.resume()
        await b.acked(ack("a"))

    with pytest.raises(ReplayError, match="re-run the replay"):
        asyncio.run(run())


@pytest.mark.parametrize(("every", "interval"), [(0, 300.0), (None, 0.0), (None, -1.0)])
def test_commit_pacing_is_validated(every: int | None, interval: float) -> None:
    with pytest.raises(ConfigError):
        backfill_config(LedgerConfig(), every, interval)


# -- exports from outcomes ---------------------------------------------------------------------


def test_build_exports_counts_thresholds_and_duplicates() -> None:
    same_prompt = [ChatMessage(role="user", content="Capital of France? mail me at a@b.io")]
    good = live_trajectory(
        [*call_events("good", steps=1)[:-1], end("good", step_count=1, output="Paris.")]
    )
    bad = live_trajectory(
        [
            *call_events("bad", steps=1)[:-1],
            end("bad", step_count=1, output="Lyon.", status=CallStatus.ERROR),
        ]
    )
    good = good.model_copy(update={"input_messages": same_prompt})
    bad = bad.model_copy(update={"input_messages": same_prompt})
    twin = good.model_copy(update={"call_id": "twin", "trajectory_id": "twin"})
    outcomes = []
    for t in (good, bad, twin):
        r = Rewarder(success)(t)
        outcomes.append(Outcome(t, T0, 0, [r], [None], [[]]))
    redactor = Redactor()
    files = {
        f.name: f
        for f in build_exports(outcomes, min_reward=0.5, dpo_margin=0.5, redactor=redactor)
    }
    assert len(files["trajectories.jsonl"].rows) == 3
    sft = files["sft.jsonl"]
    assert len(sft.rows) == 1 and sft.duplicates_removed == 1  # good and twin are the same row
    assert sft.extra["below_min_reward"] == 1
    assert sft.traces == [{"call_id": "good", "reward": 1.0}]
    dpo = files["dpo.jsonl"]
    assert len(dpo.rows) == 1
    assert dpo.rows[0]["preferred_output"][0]["content"] == "Paris."
    assert dpo.rows[0]["non_preferred_output"][0]["content"] == "Lyon."
    assert dpo.rows[0]["input"]["messages"][0]["content"].endswith("[EMAIL]")
    assert redactor.counts["email"] >= 3


# -- parsing -----------------------------------------------------------------------------------

NOW = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("90m", NOW - timedelta(minutes=90)),
        ("2h", NOW - timedelta(hours=2)),
        ("7d", NOW - timedelta(days=7)),
        ("1.5s", NOW - timedelta(seconds=1.5)),
        ("2026-01-31T12:00:00Z", datetime(2026, 1, 31, 12, tzinfo=UTC)),
        ("2026-01-31T14:00+02:00", datetime(2026, 1, 31, 12, tzinfo=UTC)),
        ("2026-01-31", datetime(2026, 1, 31, tzinfo=UTC)),
    ],
)
def test_parse_time(text: str, expected: datetime) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "2h ago", "-5m", "2026-13-01"])
def test_parse_time_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ConfigError, match="bad time"):
        parse_time(text, NOW)


@pytest.mark.parametrize(
    ("spec", "topic", "partition", "start", "end"),
    [
        ("agent-events:0:100-200", "p.agent-events", 0, 100, 200),
        ("p.user-feedback:3:0-", "p.user-feedback", 3, 0, None),
    ],
)
def test_parse_offsets(spec: str, topic: str, partition: int, start: int, end: int | None) -> None:
    r = parse_offsets(spec, "p")
    assert (r.topic, r.partition, r.start, r.end) == (topic, partition, start, end)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("agent-events:0", "TOPIC:PARTITION:START-END"),
        ("agent-events:0:5-2", "END is before START"),
        ("ledger:0:0-10", "not an input topic"),
        ("other.agent-events:0:0-10", "not an input topic"),
    ],
)
def test_parse_offsets_errors(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_offsets(spec, "p")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ReplayOptions(to={"s3"}), "use trinity or files"),
        (ReplayOptions(to={"files"}), "needs --out"),
        (ReplayOptions(out=Path("x")), "needs --to files"),
        (ReplayOptions(since=NOW, until=NOW), "not after"),
        (ReplayOptions(since=NOW, offsets=[parse_offsets("agent-events:0:0-1", "p")]), "not both"),
        (ReplayOptions(compare_reward="x:y", to={"trinity"}), "leave out --to"),
        (ReplayOptions(lookback_s=-1), "negative"),
    ],
)
def test_usage_errors(options: ReplayOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        options.validate()


def test_a_reward_function_that_cannot_be_imported_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot import"):
        build_rewarder("no_such_package.rewards:fn")
    with pytest.raises(ConfigError, match="no attribute"):
        build_rewarder("streams.rewards:no_such_fn")


def test_build_rewarder_names_rewards_like_the_live_pipeline() -> None:
    assert build_rewarder("streams.rewards:success").name == "streams.rewards:success"
    composite = build_rewarder("composite", {"streams.rewards:success": 1.0})
    assert composite.name.startswith("composite(")


def test_preference_feedback_reaches_the_outcome_for_dpo() -> None:
    steps = [
        step(
            "c1", 0, response_id="r-a", output_messages=[ChatMessage(role="assistant", content="A")]
        ),
        step(
            "c1", 1, response_id="r-b", output_messages=[ChatMessage(role="assistant", content="B")]
        ),
    ]
    events = [start("c1"), *steps, end("c1", step_count=2)]
    pref = feedback(
        "c1",
        kind=FeedbackKind.PREFERENCE,
        rating=None,
        preferred_response_id="r-b",
        response_id="r-a",
    )
    c = core()
    c.feed_all(records([*events, pref]))
    c.finish()
    files = {
        f.name: f
        for f in build_exports(
            c.outcomes, min_reward=0.5, dpo_margin=0.5, redactor=Redactor(enabled=False)
        )
    }
    [row] = files["dpo.jsonl"].rows
    assert row["preferred_output"] == [{"role": "assistant", "content": "B"}]
    assert row["non_preferred_output"] == [{"role": "assistant", "content": "A"}]
    assert files["dpo.jsonl"].traces[0]["source"] == "preference"


def test_rewarded_records_equal_what_the_live_rewarder_makes() -> None:
    events = call_events("c1", mark=mark(task_id="t-1", run_id=2))
    c = core()
    c.feed_all(records(events))
    c.finish()
    [o] = c.outcomes
    r = o.rewards[0]
    assert isinstance(r, RewardedTrajectory)
    assert (r.task_id, r.run_id, r.labels) == ("t-1", 2, ["gold"])
    assert r.msg_ids == ["chatcmpl-c1-0", "chatcmpl-c1-2"]


def test_read_ledger_finds_acknowledged_and_uncommitted_feedback() -> None:
    from streams.runtime.replay import ack_key, commit_key, read_ledger

    keys = [
        ack_key("r1", "a"),
        ack_key("other", "x"),
        ack_key("r1", "b"),
        commit_key("r1"),
        ack_key("r1", "c"),
        None,
        commit_key("other"),
        ack_key("r1", "d"),
    ]
    assert read_ledger(keys, "r1") == ({"a", "b", "c", "d"}, 2)
    assert read_ledger(keys, "other") == ({"x"}, 0)
    assert read_ledger([], "r1") == (set(), 0)


def test_a_call_without_an_llm_step_is_not_rewarded_in_replay_either() -> None:
    """Like the live reward stage: nothing trainable, a reward-stage reject with the live
    dead letter's reason, never a feedback to plan."""
    from streams.core.reward_join import NOTHING_TRAINABLE

    c = core()
    c.feed_all(
        records([start("c1"), step("c1", 0, kind=StepKind.TOOL), end("c1", step_count=1)], t=0)
    )
    c.finish()
    [o] = c.outcomes
    assert c.scored() == [] and o.errors == [NOTHING_TRAINABLE]
    assert c.stats["nothing_trainable.0"] == 1 and c.stats["rewarded.0"] == 0
    assert [(r.stage, r.reason) for r in c.rejects] == [("reward", NOTHING_TRAINABLE)]


# -- the LLM judge in replay ---------------------------------------------------------------------


def _verdict(call_id: str, score: float | None, judged: float = 3) -> Any:
    from streams.models import JudgeVerdict

    return JudgeVerdict(
        call_id=call_id,
        trajectory_id=call_id,
        score=score,
        error=None if score is not None else "garbage answer: empty",
        judge_model="j",
        prompt_hash="h" * 64,
        requested_at=at(2),
        judged_at=at(judged),
    )


def _judge_core() -> ReplayCore:
    from streams.core.judge import JudgeSpec

    return ReplayCore(
        ALL,
        [build_rewarder("streams.rewards:judge")],
        limits=LIMITS,
        judge=JudgeSpec(model="j", rubric="Score."),
    )


def _call(call_id: str, offset: int) -> list[SourceRecord]:
    return [
        rec(start(call_id), 0, offset=offset),
        rec(step(call_id, 0), 1, offset=offset + 1),
        rec(end(call_id, step_count=1), 2, offset=offset + 2),
    ]


def test_replay_reuses_the_last_stored_verdict_of_a_call_and_asks_for_the_others() -> None:
    core = _judge_core()
    stored = [
        (0, b"c1", CODEC.encode(_verdict("c1", 0.1))),
        (0, b"c1", CODEC.encode(_verdict("c1", 0.9, judged=4))),  # the last of c1 wins
        (0, b"c3", CODEC.encode(_verdict("c3", None))),
        (0, b"c4", CODEC.encode(_verdict("c4", 0.2))),
        (0, b"c4", b""),  # a tombstone: c4 is judged again
    ]
    core.load_verdicts(stored)
    core.feed_all(_call("c1", 0) + _call("c2", 10) + _call("c3", 20) + _call("c4", 30))
    core.finish()
    assert list(core.judge_requests) == ["c2", "c4"]  # only the calls without a verdict
    request = core.judge_requests["c2"]
    assert request.model == "j" and request.rubric == "Score."
    core.add_verdicts([_verdict("c2", 0.5), _verdict("c4", 0.6), _verdict("c9", 0.5)])
    assert core.judge_requests == {}  # c9 was not asked: ignored
    assert {o.call_id: r.reward for o, r in core.scored()} == {"c1": 0.9, "c2": 0.5, "c4": 0.6}
    [error] = [o.errors[0] for o in core.outcomes if o.call_id == "c3"]
    assert error == "judge verdict without a score: garbage answer: empty"
    assert [(r.stage, r.key) for r in core.rejects] == [("judge", b"c3")]
    assert core.stats["judge.verdicts_stored"] == 2


def test_feeding_collects_garbage_less_often_and_restores_the_collector_after() -> None:
    import gc

    before = gc.get_threshold()
    during: list[tuple[int, int, int]] = []
    frozen: list[int] = []

    def records() -> Iterable[SourceRecord]:
        during.append(gc.get_threshold())
        for i in range(2 * FREEZE_EVERY + 1):
            yield SourceRecord("event", 0, i, at(i / 1000), b"call-1", b"")
            if i in (0, 2 * FREEZE_EVERY):  # get_freeze_count walks what is frozen
                frozen.append(gc.get_freeze_count())
        raise RuntimeError("the range could not be read")

    with pytest.raises(RuntimeError, match="could not be read"):
        core().feed_all(records())
    assert during[0][0] > before[0]  # young collections less often while feeding
    assert frozen[0] == 0 and frozen[-1] > 0  # what survived is frozen as the feed goes
    # as it was, also when feeding failed
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_them_frozen() -> None:
    import gc

    gc.freeze()
    try:
        kept = gc.get_freeze_count()
        core().feed_all(
            SourceRecord("event", 0, i, at(i / 1000), b"call-1", b"")
            for i in range(FREEZE_EVERY + 1)
        )
        assert gc.get_freeze_count() == kept  # neither unfrozen nor frozen further
    finally:
        gc.unfreeze()
