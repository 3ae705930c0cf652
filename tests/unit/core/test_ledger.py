"""Unit tests of streams.ledger: commit decisions and reward windows, with the clock as data.

All times are explicit: ``T0`` (aligned to the 300 s commit interval and the 60 s window) plus
offsets. Nothing sleeps and nothing reads the wall clock.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.codec import SchemaRegistry
from streams.core.ledger import (
    RECENT_IDS,
    CommitPlan,
    LedgerConfig,
    apply_ack,
    commit_done,
    drift_alerts,
    due_commit,
    due_windows,
    pool_versions,
)
from streams.models import FeedbackAck, LedgerState, WindowSummary
from tests.unit.factories import T0, ack, at

CFG = LedgerConfig(
    interval=timedelta(seconds=300),
    min_batch=1,
    commit_empty=False,
    window=timedelta(seconds=60),
    grace=timedelta(seconds=10),
)
_ids = itertools.count()


def make_ack(
    reward: float = 0.5,
    event: float = 0.0,
    *,
    tid: str | None = None,
    agent: str | None = "researcher",
    model: str | None = "qwen",
    succeeded: bool = True,
) -> FeedbackAck:
    return ack(
        tid or f"t{next(_ids)}",
        reward,
        event_time=at(event),
        agent_name=agent,
        model=model,
        succeeded=succeeded,
    )


def with_acks(*acks: tuple[float, FeedbackAck], cfg: LedgerConfig = CFG) -> LedgerState:
    """A ledger state after ``(processing_seconds, ack)`` pairs."""
    state = LedgerState()
    for now, one in acks:
        assert apply_ack(state, one, at(now), cfg)
    return state


# -- acknowledgements ------------------------------------------------------------------------


def test_duplicate_ack_is_counted_once() -> None:
    state = LedgerState()
    first = make_ack(0.8, tid="same")
    assert apply_ack(state, first, at(1), CFG) is True
    before = state.model_dump()
    assert apply_ack(state, first, at(2), CFG) is False
    assert apply_ack(state, make_ack(0.1, tid="same"), at(3), CFG) is False
    assert state.model_dump() == before
    assert (state.batch_count, state.batch_sum) == (1, 0.8)
    assert [w.count for w in state.windows] == [1]


def test_duplicate_ack_after_a_commit_is_still_counted_once() -> None:
    state = with_acks((1, make_ack(tid="a")))
    plan = due_commit(state, at(300), CFG)
    assert plan is not None
    commit_done(state, plan, "{}")
    assert apply_ack(state, make_ack(tid="a"), at(301), CFG) is False
    assert state.batch_count == 0


def test_recent_ids_are_bounded() -> None:
    state = LedgerState()
    for i in range(RECENT_IDS + 5):
        apply_ack(state, make_ack(tid=f"id-{i}"), at(1), CFG)
    assert len(state.recent_ids) == RECENT_IDS
    assert state.recent_ids[-1] == f"id-{RECENT_IDS + 4}"
    assert apply_ack(state, make_ack(tid=f"id-{RECENT_IDS + 4}"), at(1), CFG) is False


def test_batch_statistics() -> None:
    state = with_acks((5, make_ack(0.5)), (6, make_ack(0.1)), (7, make_ack(0.9)))
    assert (state.batch_count, state.batch_start) == (3, at(5))
    assert state.batch_sum == pytest.approx(1.5)
    assert (state.batch_min, state.batch_max) == (0.1, 0.9)
    assert state.last_event == at(7)


# -- commits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acked_at", "now", "due"),
    [
        (None, 10_000, False),  # nothing acknowledged: nothing to commit
        (10, 10, False),
        (10, 299.999, False),  # interval [0, 300) not over yet
        (10, 300, True),  # aligned boundary, not 300 s after the ack
        (299, 300, True),
        (299.999, 300, True),
        (300, 599, False),
        (300, 600, True),
        (10, 5000, True),
    ],
)
def test_commit_due_after_the_aligned_interval_of_the_batch_start(
    acked_at: float | None, now: float, due: bool
) -> None:
    state = LedgerState() if acked_at is None else with_acks((acked_at, make_ack()))
    before = state.model_dump()
    plan = due_commit(state, at(now), CFG)
    assert (plan is not None) is due
    assert state.model_dump() == before  # deciding changes nothing


def test_commit_plan_and_record() -> None:
    state = with_acks((10, make_ack(0.2)), (20, make_ack(1.0)), (30, make_ack(0.6)))
    plan = due_commit(state, at(300), CFG)
    assert plan is not None
    assert plan.reward_sum == pytest.approx(1.8)
    assert plan == CommitPlan(
        seq=0,
        interval_start=at(10),
        interval_end=at(300),
        count=3,
        reward_sum=plan.reward_sum,
        reward_min=0.2,
        reward_max=1.0,
        final=False,
        requests=3,
    )
    record = commit_done(state, plan, '{"status": "ok"}')
    assert (record.commit_seq, record.feedback_count, record.final) == (0, 3, False)
    assert record.feedback_requests == 3
    assert (record.interval_start, record.interval_end) == (at(10), at(300))
    assert record.reward_mean == pytest.approx(0.6)
    assert (record.reward_min, record.reward_max) == (0.2, 1.0)
    assert record.trinity_response == '{"status": "ok"}'
    # the batch is reset and the sequence moves on
    assert (state.batch_count, state.batch_sum, state.batch_start) == (0, 0.0, None)
    assert (state.next_seq, state.last_commit) == (1, at(300))
    assert due_commit(state, at(10_000), CFG) is None


def test_next_batch_has_its_own_statistics() -> None:
    state = with_acks((10, make_ack(0.9)), (11, make_ack(1.0)))
    plan = due_commit(state, at(300), CFG)
    assert plan is not None
    commit_done(state, plan, "")
    apply_ack(state, make_ack(0.1), at(400), CFG)
    apply_ack(state, make_ack(0.3), at(401), CFG)
    assert due_commit(state, at(599), CFG) is None
    plan = due_commit(state, at(600), CFG)
    assert plan is not None
    record = commit_done(state, plan, "")
    assert (record.commit_seq, record.feedback_count) == (1, 2)
    assert (record.reward_min, record.reward_max) == (0.1, 0.3)
    assert record.reward_mean == pytest.approx(0.2)
    assert record.interval_start == at(400)


def test_small_batch_carries_over_until_min_batch() -> None:
    cfg = LedgerConfig(min_batch=3)
    state = with_acks((10, make_ack(0.1)), (20, make_ack(0.2)), cfg=cfg)
    assert due_commit(state, at(300), cfg) is None
    assert due_commit(state, at(900), cfg) is None
    apply_ack(state, make_ack(0.3), at(950), cfg)
    plan = due_commit(state, at(950), cfg)
    assert plan is not None  # the batch started long ago: due at once
    assert (plan.count, plan.interval_start, plan.seq) == (3, at(10), 0)


def test_commit_empty() -> None:
    cfg = LedgerConfig(commit_empty=True)
    state = LedgerState()
    plan = due_commit(state, at(5), cfg)
    assert plan is not None and plan.count == 0
    record = commit_done(state, plan, "")
    assert (record.feedback_count, record.reward_mean, record.reward_min, record.reward_max) == (
        0,
        None,
        None,
        None,
    )
    assert due_commit(state, at(299), cfg) is None  # one commit per interval
    plan = due_commit(state, at(300), cfg)
    assert plan is not None
    assert (plan.seq, plan.count, plan.interval_start, plan.interval_end) == (1, 0, at(5), at(300))


def test_commit_empty_respects_min_batch_for_non_empty_batches() -> None:
    cfg = LedgerConfig(commit_empty=True, min_batch=2)
    state = with_acks((10, make_ack()), cfg=cfg)
    assert due_commit(state, at(600), cfg) is None


@pytest.mark.parametrize("min_batch", [1, 5])
def test_final_commits_whatever_was_acknowledged(min_batch: int) -> None:
    cfg = LedgerConfig(min_batch=min_batch, commit_empty=True)
    assert due_commit(LedgerState(), at(5), cfg, final=True) is None
    state = with_acks((10, make_ack(0.4)), cfg=cfg)
    plan = due_commit(state, at(11), cfg, final=True)  # same interval, below min_batch
    assert plan is not None
    assert (plan.final, plan.count, plan.reward_sum) == (True, 1, 0.4)
    assert commit_done(state, plan, "").final is True


# -- windows ---------------------------------------------------------------------------------


def summaries_at(state: LedgerState, now: float) -> list[WindowSummary]:
    return due_windows(state, at(now), CFG)


@settings(max_examples=100, deadline=None)
@given(
    rewards=st.lists(
        st.tuples(st.floats(-100, 100, allow_nan=False), st.booleans()), min_size=1, max_size=50
    )
)
def test_window_statistics_are_welfords(rewards: list[tuple[float, bool]]) -> None:
    state = LedgerState()
    for i, (reward, ok) in enumerate(rewards):
        apply_ack(state, make_ack(reward, event=i % 60, succeeded=ok), at(1), CFG)
    [summary] = summaries_at(state, 10_000)
    values = [r for r, _ in rewards]
    assert summary.count == len(values)
    assert summary.mean == pytest.approx(statistics.fmean(values), abs=1e-9)
    assert summary.stddev == pytest.approx(statistics.pstdev(values), abs=1e-6)
    assert (summary.min, summary.max) == (min(values), max(values))
    assert summary.success_rate == pytest.approx(sum(ok for _, ok in rewards) / len(rewards))
    assert (summary.window_start, summary.window_end) == (T0, at(60))


def test_single_value_window_has_zero_stddev() -> None:
    state = with_acks((1, make_ack(0.7, event=3)))
    [summary] = summaries_at(state, 10_000)
    assert (summary.count, summary.mean, summary.stddev, summary.min, summary.max) == (
        1,
        0.7,
        0.0,
        0.7,
        0.7,
    )


def test_window_closes_when_the_watermark_passes_end_plus_grace() -> None:
    # processing time follows event time closely, so the ledger is never idle
    state = with_acks((0, make_ack(event=0)), (50, make_ack(event=50)))
    apply_ack(state, make_ack(event=69.999), at(69.999), CFG)
    assert summaries_at(state, 70) == []  # watermark 69.999 - grace < end 60
    apply_ack(state, make_ack(event=70), at(70), CFG)
    [summary] = summaries_at(state, 70)
    assert (summary.window_start, summary.window_end, summary.count) == (T0, at(60), 2)
    assert summary.emitted_at == at(70)
    assert [w.window_start for w in state.windows] == [at(60)]  # the next window stays open


def test_window_at_a_boundary_belongs_to_the_next_window() -> None:
    state = with_acks((0, make_ack(event=59.999)), (0, make_ack(event=60)))
    assert sorted(w.window_start for w in state.windows) == [T0, at(60)]


def test_idle_ledger_closes_windows_by_the_wall_clock() -> None:
    state = with_acks((5, make_ack(event=5)))
    assert summaries_at(state, 14.999) == []  # not idle yet
    assert summaries_at(state, 15) == []  # idle, but the window has not ended
    assert summaries_at(state, 69.999) == []  # the window ended, the grace period has not
    [summary] = summaries_at(state, 70)  # window end (60 s) + grace (10 s)
    assert summary.window_end == at(60)


def test_busy_ledger_does_not_close_by_the_wall_clock() -> None:
    state = with_acks((5, make_ack(event=5)))
    apply_ack(state, make_ack(event=6), at(100), CFG)  # event time lags processing time
    assert summaries_at(state, 105) == []  # busy: only the watermark (6 s) counts
    assert len(summaries_at(state, 110)) == 1  # idle for the grace period


def test_each_window_is_emitted_once() -> None:
    state = with_acks((0, make_ack(event=1)), (0, make_ack(event=61)))
    first = summaries_at(state, 1000)
    assert [s.window_start for s in first] == [T0, at(60)]  # oldest first
    assert summaries_at(state, 1000) == []
    assert summaries_at(state, 5000) == []
    assert state.windows == []


def test_windows_are_per_agent_and_model() -> None:
    state = with_acks(
        (0, make_ack(0.1, event=1, agent="a", model="m1")),
        (0, make_ack(0.3, event=2, agent="a", model="m1")),
        (0, make_ack(0.5, event=3, agent="a", model="m2")),
        (0, make_ack(0.9, event=4, agent="b", model="m1")),
        (0, make_ack(0.2, event=5, agent=None, model=None)),
    )
    got = {(s.agent_name, s.model): (s.count, s.mean) for s in summaries_at(state, 1000)}
    assert got == {
        ("-", "-"): (1, 0.2),
        ("a", "m1"): (2, pytest.approx(0.2)),
        ("a", "m2"): (1, 0.5),
        ("b", "m1"): (1, 0.9),
    }


def test_late_acks_are_counted_in_the_next_summary_of_their_agent_and_model() -> None:
    state = with_acks((0, make_ack(event=10, agent="a")), (0, make_ack(event=10, agent="b")))
    assert len(summaries_at(state, 1000)) == 2
    # two late acks for a, one for b: counted in the commit batch, in no window
    for agent in ("a", "a", "b"):
        assert apply_ack(state, make_ack(event=30, agent=agent), at(1001), CFG)
    assert state.batch_count == 5
    assert state.windows == []
    assert state.late == {"a|qwen": 2, "b|qwen": 1}
    # a new window of a only: a's summary reports a's late acks, b's stay pending
    apply_ack(state, make_ack(event=1010, agent="a"), at(1002), CFG)
    [summary] = summaries_at(state, 5000)
    assert (summary.agent_name, summary.count, summary.late) == ("a", 1, 2)
    assert state.late == {"b|qwen": 1}
    apply_ack(state, make_ack(event=2000, agent="b"), at(5001), CFG)
    [summary] = summaries_at(state, 9000)
    assert (summary.agent_name, summary.late) == ("b", 1)
    assert state.late == {}


def test_an_ack_for_a_window_after_the_closed_one_is_not_late() -> None:
    state = with_acks((0, make_ack(event=10)))
    summaries_at(state, 1000)
    assert apply_ack(state, make_ack(event=60), at(1001), CFG)
    assert state.late == {}
    assert [w.window_start for w in state.windows] == [at(60)]


def test_watermark_is_the_largest_event_time() -> None:
    state = with_acks((0, make_ack(event=50)), (1, make_ack(event=20)), (2, make_ack(event=40)))
    assert state.watermark == at(50)


def test_no_acks_no_windows() -> None:
    assert due_windows(LedgerState(), at(0), CFG) == []


# -- the state survives a restart ------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0, 1),  # reward
            st.integers(0, 400),  # event time
            st.integers(0, 30),  # processing time advance
            st.sampled_from(["a", "b"]),
            st.booleans(),  # redelivered
        ),
        max_size=30,
    )
)
def test_state_round_trips_through_the_codec_between_acks(steps: list[Any]) -> None:
    codec = SchemaRegistry.default()
    kept, restarted = LedgerState(), LedgerState()
    out_kept: list[Any] = []
    out_restarted: list[Any] = []
    now, previous = 0.0, None
    for reward, event, advance, agent, again in steps:
        now += advance
        one = previous if (again and previous) else make_ack(reward, event, agent=agent)
        previous = one
        for state, out in ((kept, out_kept), (restarted, out_restarted)):
            out.append(apply_ack(state, one, at(now), CFG))
            out.extend(s.model_dump() for s in due_windows(state, at(now), CFG))
            plan = due_commit(state, at(now), CFG)
            if plan is not None:
                out.append(commit_done(state, plan, "").model_dump())
        restarted = codec.decode_as(codec.encode(restarted), LedgerState)
    assert out_restarted == out_kept
    assert restarted == kept


def test_a_final_commit_is_not_a_second_commit_in_one_interval() -> None:
    state = with_acks((1, make_ack(event=1)))
    plan = due_commit(state, at(301), CFG)
    assert plan is not None
    commit_done(state, plan, "{}")
    apply_ack(state, make_ack(event=302, tid="late-one"), at(302), CFG)
    # a stop in the interval that already had a commit leaves the batch to the next owner
    assert due_commit(state, at(303), CFG, final=True) is None
    final = due_commit(state, at(601), CFG, final=True)
    assert final is not None and final.count == 1 and final.final


def test_without_handover_a_final_commit_commits_what_is_left() -> None:
    """Replay's end: no next owner takes the ledger over, so it commits the batch at once."""
    cfg = replace(CFG, handover=False)
    state = with_acks((1, make_ack(event=1)), cfg=cfg)
    plan = due_commit(state, at(301), cfg)
    assert plan is not None
    commit_done(state, plan, "{}")
    apply_ack(state, make_ack(event=302, tid="late-one"), at(302), cfg)
    final = due_commit(state, at(303), cfg, final=True)
    assert final is not None and final.count == 1 and final.final


def test_a_full_batch_commits_before_its_interval_ends() -> None:
    cfg = replace(CFG, max_batch=2)
    state = with_acks((1, make_ack(tid="a")), cfg=cfg)
    assert due_commit(state, at(2), cfg) is None  # one of two, the interval still running
    apply_ack(state, make_ack(tid="b"), at(3), cfg)
    plan = due_commit(state, at(3), cfg)
    assert plan is not None and plan.count == 2 and not plan.final
    commit_done(state, plan, "{}")
    assert due_commit(state, at(4), cfg) is None  # never an empty commit
    apply_ack(state, make_ack(tid="c"), at(301), cfg)
    plan = due_commit(state, at(602), cfg)  # the interval ended: due with one
    assert plan is not None and plan.count == 1


def test_a_batch_that_was_not_sent_is_recorded_and_reset() -> None:
    state = with_acks((1, make_ack(event=1)))
    plan = due_commit(state, at(301), CFG)
    assert plan is not None
    plan.ready_before = 7
    record = commit_done(state, plan, '{"not_sent": "x"}', sent=False, experiences=0)
    assert not record.sent and record.experiences == 0 and record.feedback_count == 1
    assert state.batch_count == 0 and state.next_seq == plan.seq + 1
    assert state.ready_at_last_commit is None  # only a sent commit moves the mark


def test_a_sent_commit_remembers_trinitys_ready_count() -> None:
    state = with_acks((1, make_ack(event=1)))
    plan = due_commit(state, at(301), CFG)
    assert plan is not None
    plan.ready_before = 12
    record = commit_done(state, plan, "{}", experiences=5)
    assert record.sent and record.experiences == 5
    assert state.ready_at_last_commit == 12


def test_feedback_requests_are_counted_once_per_trajectory() -> None:
    """Per-step rewards: a trajectory's acknowledgement says how many /feedback requests it
    took; a redelivered acknowledgement counts neither the trajectory nor its requests again."""
    three = make_ack(0.5, tid="steps").model_copy(update={"feedbacks": 3})
    state = LedgerState()
    assert apply_ack(state, three, at(1), CFG)
    assert not apply_ack(state, three, at(2), CFG)  # redelivered
    assert apply_ack(state, make_ack(0.5), at(3), CFG)
    assert (state.batch_count, state.batch_requests) == (2, 4)
    plan = due_commit(state, at(300), CFG)
    assert plan is not None and plan.requests == 4
    record = commit_done(state, plan, "{}")
    assert (record.feedback_count, record.feedback_requests) == (2, 4)
    assert state.batch_requests == 0


# -- the policy's windows per version -----------------------------------------------------------


def policy_ack(version: int | None, reward: float, event: float, upstream: str = "trinity") -> Any:
    return ack(
        f"t{next(_ids)}",
        reward,
        event_time=at(event),
        agent_name="a",
        model="m",
        upstream=upstream,
        policy_version=version,
    )


def test_the_policys_windows_are_kept_per_version_and_lateness_per_key() -> None:
    state = with_acks(
        (0, policy_ack(3, 1.0, 10)),
        (0, policy_ack(4, 0.0, 20)),
        (0, policy_ack(4, 0.5, 30)),
        (0, policy_ack(None, 0.2, 40)),
        # the version of another upstream's call (a mixed one) does not split its window
        (0, policy_ack(4, 0.3, 40, upstream="mixed")),
        (0, policy_ack(3, 0.3, 40, upstream="mixed")),
    )
    got = {(s.upstream, s.policy_version): s.count for s in summaries_at(state, 1000)}
    assert got == {("trinity", None): 1, ("trinity", 3): 1, ("trinity", 4): 2, ("mixed", None): 2}
    # one lateness mark per agent|model|upstream, however many versions closed
    assert state.closed_until == {"a|m|trinity": 60_000 + T0_MS, "a|m|mixed": 60_000 + T0_MS}
    assert apply_ack(state, policy_ack(5, 1.0, 50), at(1001), CFG)
    assert state.late == {"a|m|trinity": 1} and state.windows == []


T0_MS = int(T0.timestamp() * 1000)


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(
        st.tuples(st.sampled_from([None, 1, 2, 3]), st.floats(-10, 10, allow_nan=False)),
        min_size=1,
        max_size=40,
    )
)
def test_pooling_the_versions_of_a_window_is_the_window_they_split(
    rewards: list[tuple[int | None, float]],
) -> None:
    split, whole = LedgerState(), LedgerState()
    for i, (version, reward) in enumerate(rewards):
        apply_ack(split, policy_ack(version, reward, i % 60), at(1), CFG)
        apply_ack(whole, policy_ack(None, reward, i % 60), at(1), CFG)
    [pooled] = pool_versions(summaries_at(split, 10_000))
    [direct] = summaries_at(whole, 10_000)
    assert pooled.count == direct.count
    for name in ("mean", "stddev", "min", "max", "success_rate"):
        assert getattr(pooled, name) == pytest.approx(getattr(direct, name), abs=1e-6), name
    versions = {v for v, _ in rewards}
    assert pooled.policy_version == (versions.pop() if len(versions) == 1 else None)


def test_drift_reads_a_window_with_every_version_pooled() -> None:
    state = with_acks(
        (0, policy_ack(3, 1.0, 10)), (0, policy_ack(4, 0.0, 20)), (0, policy_ack(4, 0.5, 30))
    )
    state.trailing = {"a|m|trinity": [0.9, 0.9]}
    alerts = drift_alerts(state, summaries_at(state, 1000), at(1000), CFG)
    (alert,) = alerts  # one alert for the window, on its pooled mean (0.5 < 0.8 x 0.9)
    assert alert.mean == pytest.approx(0.5)
    assert state.trailing["a|m|trinity"] == [0.9, 0.9, pytest.approx(0.5)]
