"""Both arms scored: a call a gateway routed to production is assembled and scored with the
same reward function as the policy's, says so on its rewarded record, is sent to no one, and
counts in its upstream's windows only, never in a commit's batch or a drift alert. A call routed
to the policy that production answered, in whole (``trinity-fallback``) or in part (``mixed``),
is scored and counted the same way and never trained by default; only Trinity's ids are ever
sent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from streams.core.arms import (
    call_arm,
    policy_version_of,
    routed_upstream,
    scored_unselected,
    trained_msg_ids,
    trains,
)
from streams.core.backfill import plan_feedback
from streams.core.feedback import feedback_requests
from streams.core.ledger import LedgerConfig, apply_ack, drift_alerts, due_windows
from streams.core.rewards import Rewarder, build_rewarder, success
from streams.core.select import build_strategy
from streams.models import (
    AgentCall,
    AvroModel,
    Completion,
    FeedbackAck,
    LedgerState,
    RewardedTrajectory,
    StepKind,
    Trajectory,
)
from tests.unit.core.harness import Core
from tests.unit.factories import T0, at, end, rewarded, start, step, trajectory

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


# -- the policy as a fallible upstream: fallback and mixed calls ---------------------------------

P, T = "production", "trinity"


def llm(seq: int, by: str, *, fallback: str | None = None, **kw: Any) -> Completion:
    """An LLM step as the gateway records it: answered ``by`` an upstream (a fallback step says
    production and why); Trinity's ids are ``chatcmpl-…``, production's ``prod-…``."""
    rid = f"chatcmpl-c-{seq}" if by == T else f"prod-c-{seq}"
    return step("c", seq=seq, upstream=by, fallback=fallback, response_id=rid, **kw)


@pytest.mark.parametrize(
    ("route", "steps", "arm"),
    [
        ("trinity", [], "trinity"),
        ("trinity", [llm(0, T), llm(1, T)], "trinity"),
        ("trinity", [llm(0, P, fallback="connect")], "trinity-fallback"),
        ("trinity", [llm(0, P, fallback="breaker_open"), llm(1, P, fallback="sticky")],
         "trinity-fallback"),
        # a fallback step that does not say production is production's all the same
        ("trinity", [llm(0, T, fallback="timeout")], "trinity-fallback"),
        ("trinity", [llm(0, T), llm(1, P, fallback="status_5xx")], "mixed"),
        ("trinity", [llm(0, T), llm(1, T, error_type="ReadError")], "mixed"),
        ("trinity", [llm(0, T, error_type="ReadError")], "mixed"),
        # production failing after a fallback is production's failure: still a fallback
        ("trinity", [llm(0, P, fallback="connect", error_type="ReadError")], "trinity-fallback"),
        # tool steps say nothing of who answered
        ("trinity", [llm(0, T), step("c", seq=1, kind=StepKind.TOOL)], "trinity"),
        ("production", [llm(0, P)], "production"),
        ("production", [llm(0, P, error_type="ReadError")], "production"),
        (None, [llm(0, P, fallback="connect")], None),  # no gateway routed it: unaffected
    ],
)  # fmt: skip
def test_the_arm_of_a_call_from_its_steps(
    route: str | None, steps: list[Completion], arm: str | None
) -> None:
    first = start("c") if route is None else routed("c", route, route == T)
    assert call_arm(first, steps) == arm


def test_a_shadowed_call_stays_shadowed() -> None:
    shadowed = llm(0, P, shadow_response_id="chatcmpl-s-0")
    assert call_arm(routed("c", P, True, "shadow"), [shadowed]) == "trinity-shadow"


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ([], None),
        ([None, None], None),
        ([3], 3),
        ([4, 3, 4], 3),  # a call two versions answered counts for the older
        ([None, 5], 5),
    ],
)
def test_the_policy_version_of_a_call(versions: list[int | None], expected: int | None) -> None:
    steps = [llm(i, T, policy_version=v) for i, v in enumerate(versions)]
    assert policy_version_of(steps) == expected
    # a fallback step's version (not expected) is not the policy's
    assert policy_version_of([*steps, llm(9, P, fallback="sticky", policy_version=1)]) == expected


def test_a_step_that_fell_back_never_has_a_msg_id() -> None:
    assert llm(0, P, fallback="connect").msg_id is None
    assert llm(0, T, fallback="connect").msg_id is None  # whatever its upstream says
    assert llm(0, T).msg_id == "chatcmpl-c-0"


def traj(arm: str, steps: list[Completion]) -> Trajectory:
    return trajectory("c", steps=steps, upstream=arm)


MIXED_STEPS = [llm(0, T), llm(1, T, error_type="ReadError"), llm(2, P, fallback="sticky")]


@pytest.mark.parametrize(
    ("arm", "steps", "train_mixed", "sent", "trained"),
    [
        ("trinity", [llm(0, T), llm(1, T)], False, ["chatcmpl-c-0", "chatcmpl-c-1"], True),
        ("production", [llm(0, P)], False, [], False),
        ("trinity-fallback", [llm(0, P, fallback="connect")], False, [], False),
        ("trinity-fallback", [llm(0, P, fallback="connect")], True, [], False),
        ("mixed", MIXED_STEPS, False, [], False),
        # with reward.train_mixed: the steps Trinity answered in full, never production's
        ("mixed", MIXED_STEPS, True, ["chatcmpl-c-0"], True),
        ("mixed", [llm(0, T, error_type="ReadError"), llm(1, P, fallback="sticky")], True, [],
         False),
    ],
)  # fmt: skip
def test_what_each_arm_sends_to_trinity(
    arm: str, steps: list[Completion], train_mixed: bool, sent: list[str], trained: bool
) -> None:
    t = traj(arm, steps)
    assert trained_msg_ids(t, train_mixed=train_mixed) == sent
    scored = Rewarder(success, train_mixed=train_mixed)(t)
    assert scored.msg_ids == sent and trains(scored.model_copy(update={"upstream": arm})) is trained
    requests = feedback_requests(scored.model_copy(update={"upstream": arm}))
    assert [m for r in requests for m in r.msg_ids] == (sent if trained else [])
    assert not any(m.startswith("prod-") for r in requests for m in r.msg_ids)


def test_training_mixed_calls_is_part_of_the_rewarders_version() -> None:
    assert Rewarder(success).version == "1"
    assert Rewarder(success, train_mixed=True).version == "1+train_mixed"
    assert build_rewarder("streams.rewards:success", train_mixed=True).train_mixed


def test_step_rewards_of_a_mixed_call_name_only_the_steps_sent() -> None:
    t = traj("mixed", MIXED_STEPS)
    discounted = Rewarder(success, step_discount=0.5, train_mixed=True)(t)
    # the discount counts every Trinity step; only the ones sent keep a reward of their own
    assert discounted.msg_ids == ["chatcmpl-c-0"]
    assert discounted.step_rewards == {"chatcmpl-c-0": 0.5}
    assert Rewarder(success, step_discount=0.5)(t).step_rewards == {}


def fell_back(cid: str, *steps: Completion) -> list[AvroModel]:
    return [
        routed(cid, "trinity", True),
        *(s.model_copy(update={"call_id": cid, "event_id": f"{cid}/{s.seq}"}) for s in steps),
        end(cid, step_count=len(steps)),
    ]


def test_fallback_and_mixed_calls_are_scored_counted_and_not_trained() -> None:
    core = Core(strategy=build_strategy("sampling:0"))
    calls = {
        "t": fell_back("t", llm(0, T, policy_version=4), llm(1, T, policy_version=5)),
        "f": fell_back("f", llm(0, P, fallback="connect"), llm(1, P, fallback="sticky")),
        "m": fell_back("m", llm(0, T, policy_version=5), llm(1, P, fallback="timeout")),
        "b": fell_back("b", llm(0, T, policy_version=5, error_type="RemoteProtocolError")),
    }
    for records in calls.values():
        for i, r in enumerate(records):
            core.event(r, at(i))
    by_call = {r.call_id: r for r in core.topic("rewarded")}
    assert {c: (r.upstream, r.policy_version, r.msg_ids) for c, r in by_call.items()} == {
        "t": ("trinity", 4, ["chatcmpl-c-0", "chatcmpl-c-1"]),
        "f": ("trinity-fallback", None, []),
        "m": ("mixed", 5, []),
        "b": ("mixed", 5, []),
    }
    assert {t.call_id: t.policy_version for t in core.topic("trajectories")}["t"] == 4
    assert [c for c, r in by_call.items() if feedback_requests(r)] == ["t"]
    assert core.rejects() == []  # scored, not "nothing trainable"
    assert core.out.stats["trajectories.rewarded_fallback"] == 1
    assert core.out.stats["trajectories.rewarded_mixed"] == 2


def test_a_replay_says_why_fallbacks_are_not_sent() -> None:
    plan = plan_feedback(
        [
            rewarded("f", upstream="trinity-fallback", msg_ids=[]),
            rewarded("m", upstream="mixed", msg_ids=[]),
            rewarded("m2", upstream="mixed"),  # reward.train_mixed named its Trinity steps
        ],
        set(),
    )
    assert [r.call_id for r in plan.send] == ["m2"]
    assert [(c, why.split(":")[0]) for c, why in plan.unsendable] == [
        ("f", "routed to the policy, answered by production (fallback)"),
        ("m", "answered in part by production (mixed)"),
    ]


def test_fallback_windows_hold_no_training_and_no_commit() -> None:
    state = LedgerState()
    state.trailing = {f"researcher|m|{u}": [1.0, 1.0] for u in ("trinity-fallback", "mixed")}
    for i, upstream in enumerate(["trinity-fallback", "mixed", "trinity"]):
        scored = rewarded(f"c{i}", 0.0, upstream=upstream, event_time=at(5), model="m")
        if upstream != "trinity":  # as the reward stage writes them: nothing to send
            scored = scored.model_copy(update={"msg_ids": []})
        apply_ack(state, FeedbackAck(rewarded=scored, acked_at=at(6), feedbacks=0), at(6), CFG)
    assert state.batch_count == 1  # the policy's call only
    assert drift_alerts(state, due_windows(state, at(100), CFG), at(100), CFG) == []
