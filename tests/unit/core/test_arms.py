"""Both arms scored (issue 22): a call a gateway routed to production is assembled and scored
with the same reward function as the policy's, says so on its rewarded record, is sent to no
one, and counts in its upstream's windows only, never in a commit's batch or a drift alert."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streams.core.arms import routed_upstream, scored_unselected, trains
from streams.core.backfill import plan_feedback
from streams.core.feedback import feedback_requests
from streams.core.ledger import LedgerConfig, apply_ack, drift_alerts, due_windows
from streams.core.select import build_strategy
from streams.models import AgentCall, FeedbackAck, LedgerState, RewardedTrajectory, Trajectory
from tests.unit.core.harness import Core
from tests.unit.factories import T0, at, end, rewarded, start, step

CFG = LedgerConfig(window=timedelta(seconds=60), grace=timedelta(seconds=10))


def routed(call_id: str, upstream: str, selected: bool, mode: str = "route") -> AgentCall:
    return start(
        call_id,
        attributes={
            "trajstream.route.upstream": upstream,
            "trajstream.route.mode": mode,
            "trajstream.route.selected": "true" if selected else "false",
        },
    )


@pytest.mark.parametrize(
    ("upstream", "selected", "mode", "expected"),
    [
        ("trinity", True, "route", "trinity"),
        ("production", False, "route", "production"),
        ("production", True, "shadow", "trinity-shadow"),
        ("production", False, "shadow", "production"),
    ],
)
def test_the_routed_upstream_of_a_start(
    upstream: str, selected: bool, mode: str, expected: str
) -> None:
    assert routed_upstream(routed("c", upstream, selected, mode)) == expected


def test_a_call_no_gateway_routed_has_no_upstream() -> None:
    assert routed_upstream(start()) is None and routed_upstream(None) is None
    assert not scored_unselected(start())


def run(strategy: str, *starts: AgentCall) -> Core:
    core = Core(strategy=build_strategy(strategy))
    for s in starts:
        core.event(s, T0)
        core.event(step(s.call_id, seq=0), at(1))
        core.event(end(s.call_id, step_count=1), at(2))
    return core


def test_a_production_call_is_scored_but_not_selected() -> None:
    core = run("sampling:0", routed("p-1", "production", False), start("sdk-1"))
    (traj,) = core.topic("trajectories")  # the unrouted, unselected call is not assembled
    assert isinstance(traj, Trajectory)
    assert (traj.call_id, traj.upstream, traj.selection.selected) == ("p-1", "production", False)
    (scored,) = core.topic("rewarded")
    assert isinstance(scored, RewardedTrajectory)
    assert scored.upstream == "production" and scored.reward == 1.0
    assert not trains(scored) and feedback_requests(scored) == []


def test_the_gateways_route_counts_over_the_workers_strategy() -> None:
    core = run("sampling:0", routed("t-2", "trinity", True))
    (scored,) = core.topic("rewarded")
    assert scored.upstream == "trinity" and trains(scored)
    assert len(feedback_requests(scored)) == 1


def test_both_arms_get_the_same_reward_function() -> None:
    core = run("sampling:1", routed("t-1", "trinity", True), routed("p-1", "production", False))
    by_call = {r.call_id: r for r in core.topic("rewarded")}
    assert {c: (r.upstream, r.reward, r.reward_fn) for c, r in by_call.items()} == {
        "t-1": ("trinity", 1.0, "streams.rewards:success"),
        "p-1": ("production", 1.0, "streams.rewards:success"),
    }
    assert [len(feedback_requests(by_call[c])) for c in ("t-1", "p-1")] == [1, 0]


def test_production_without_msg_ids_is_still_scored() -> None:
    core = Core(strategy=build_strategy("sampling:0"))
    s = routed("p-2", "production", False)
    core.event(s, T0)
    core.event(end("p-2", step_count=0), at(2))
    assert [r.upstream for r in core.topic("rewarded")] == ["production"]
    assert core.rejects() == []


def test_a_replay_does_not_send_production_calls() -> None:
    plan = plan_feedback(
        [rewarded("t", upstream="trinity"), rewarded("p", upstream="production")], set()
    )
    assert [r.call_id for r in plan.send] == ["t"]
    assert plan.unsendable == [("p", "answered by production: scored, not trained")]


def ack(tid: str, reward: float, upstream: str | None, event: float = 5.0) -> FeedbackAck:
    r = rewarded(tid, reward, upstream=upstream, event_time=at(event), model="m")
    return FeedbackAck(
        rewarded=r, acked_at=at(event), feedbacks=0 if upstream == "production" else 1
    )


def test_the_ledger_keeps_windows_per_upstream_and_commits_only_trained_calls() -> None:
    state = LedgerState()
    for i, (reward, upstream) in enumerate(
        [(1.0, "trinity"), (0.0, "trinity"), (0.5, "production"), (0.7, "production"), (0.2, None)]
    ):
        assert apply_ack(state, ack(f"c{i}", reward, upstream), at(6), CFG)
    assert (state.batch_count, state.batch_sum, state.batch_requests) == (3, 1.2, 3)
    summaries = due_windows(state, at(100), CFG)
    got = {(s.upstream, s.count, round(s.mean, 9)) for s in summaries}
    assert got == {("trinity", 2, 0.5), ("production", 2, 0.6), (None, 1, 0.2)}
    assert set(state.closed_until) == {
        "researcher|m",
        "researcher|m|trinity",
        "researcher|m|production",
    }


def test_production_windows_raise_no_drift_alert() -> None:
    state = LedgerState()
    state.trailing = {"researcher|m|production": [1.0, 1.0], "researcher|m|trinity": [1.0, 1.0]}
    for i, upstream in enumerate(["production", "trinity"]):
        apply_ack(state, ack(f"c{i}", 0.0, upstream), at(6), CFG)
    alerts = drift_alerts(state, due_windows(state, at(100), CFG), at(100), CFG)
    assert len(alerts) == 1 and state.trailing["researcher|m|production"] == [1.0, 1.0]
