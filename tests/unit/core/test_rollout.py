"""The rollout through the ledger stage, table-driven and scripted: a stand-in policy whose
rewards depend on its model version (better than production, then worse) against production's
fixed rewards. The share rises in bounded steps while the policy wins with confidence, rolls
back on the first confident loss and holds commits until an operator resumes; a restarted
ledger stage (a new owner over the same store) keeps it all; the same records give the same
decisions again. Per policy version: a window several versions answered is judged on the
newest one with enough calls, wins count per version, a rollback names the version that lost,
and no promotion is made while the policy falls back to production too often."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta
from typing import Any

import pytest

from streams.core.compare import CompareConfig
from streams.core.ledger import LedgerConfig, due_commit, held_commit
from streams.core.ledger_stage import LedgerStage
from streams.core.rollout import RolloutConfig, decide_rollout, judged
from streams.core.store import MemoryStore
from streams.models import (
    AvroModel,
    Comparison,
    DriftAlert,
    FeedbackAck,
    LedgerState,
    RoutingOverride,
    RoutingShare,
    WindowSummary,
)
from streams.observe.policy import replay_decisions
from tests.unit.core.harness import CODEC, EDGE
from tests.unit.factories import at, comparison, rewarded

WINDOW = 60
ROLLOUT = RolloutConfig(
    enabled=True, initial_share=0.1, step=0.1, max_share=0.3, floor=0.0, promote_after=2
)
CFG = LedgerConfig(
    interval=timedelta(seconds=10_000),
    window=timedelta(seconds=WINDOW),
    grace=timedelta(seconds=5),
    compare=CompareConfig(level=0.95, min_count=10, trailing_windows=3),
    rollout=ROLLOUT,
)
# the stand-in policy's quality by model version; production is 0.5 throughout
QUALITY = {"policy-v1": 0.8, "policy-v2": 0.2}


class Ledger:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.stage = LedgerStage(CFG, store=store, codec=CODEC)
        self.routing: list[RoutingShare] = []
        self.comparisons: list[Comparison] = []
        self.windows: list[WindowSummary] = []
        self.alerts: list[DriftAlert] = []

    def feed(self, records: list[AvroModel], now: float) -> LedgerState:
        state = self.stage.load()
        first = state.applied_offset + 1
        batch = [
            EDGE.open("ledger", 0, first + i, None, CODEC.encode(r)) for i, r in enumerate(records)
        ]
        applied = self.stage.apply(state, batch, at(now))
        out, _ = self.stage.decide(state, at(now), final=False)
        for o in (applied.out, out):
            self.routing += [r for r in o.records("routing") if isinstance(r, RoutingShare)]
            self.comparisons += [c for c in o.records("comparisons") if isinstance(c, Comparison)]
            self.windows += [w for w in o.records("windows") if isinstance(w, WindowSummary)]
            self.alerts += [a for a in o.records("alerts") if isinstance(a, DriftAlert)]
        self.stage.save(state)
        return state


def window_acks(i: int, version: str, rng: random.Random) -> list[AvroModel]:
    """Window ``i``: 20 policy calls answered by ``version``, 40 production calls."""
    acks: list[AvroModel] = []
    for n, (upstream, model, mean) in enumerate(
        [("trinity", version, QUALITY[version])] * 20 + [("production", "gpt", 0.5)] * 40
    ):
        reward = min(1.0, max(0.0, rng.gauss(mean, 0.15)))
        r = rewarded(
            f"w{i}-{n}",
            reward,
            agent_name="support",
            model=model,
            upstream=upstream,
            event_time=at(WINDOW * i + n * 0.5),
        )
        acks.append(FeedbackAck(rewarded=r, acked_at=at(WINDOW * i + 30), feedbacks=1))
    return acks


SCRIPT = ["policy-v1"] * 7 + ["policy-v2"] * 3


def run(store: MemoryStore, restart_at: int | None = None) -> Ledger:
    rng = random.Random(22)
    ledger = Ledger(store)
    for i, version in enumerate(SCRIPT):
        if i == restart_at:
            owner = Ledger(store)  # a new owner over the same store (what it printed: kept)
            owner.routing, owner.comparisons = ledger.routing, ledger.comparisons
            ledger = owner
        ledger.feed(window_acks(i, version, rng), WINDOW * i + 40)
    ledger.feed([], WINDOW * len(SCRIPT) + 40)  # closes the last window
    return ledger


def test_the_share_rises_in_steps_then_rolls_back_and_holds_commits() -> None:
    ledger = run(MemoryStore())
    window_verdicts = [c.verdict for c in ledger.comparisons if c.span == "window"]
    assert window_verdicts == ["better"] * 7 + ["worse"] * 3
    steps = [(r.action, r.previous_share, r.share, r.version) for r in ledger.routing]
    assert steps == [
        ("start", 0.0, 0.1, 1),
        ("promote", 0.1, 0.2, 2),  # two wins
        ("promote", 0.2, 0.3, 3),  # two more
        ("rollback", 0.3, 0.0, 4),  # max_share reached, then the first loss
    ]
    promote, rollback = ledger.routing[1], ledger.routing[3]
    assert [c.verdict for c in promote.evidence] == ["better", "better"]
    assert rollback.evidence[0].verdict == "worse" and rollback.evidence[0].upper < 0
    assert rollback.effective_at - rollback.decided_at == ROLLOUT.apply_delay
    state = ledger.stage.load()
    (hold,) = state.holds
    assert hold.reason == "rollback" and hold.agent_name == "support"
    # a commit due now is held, and says why
    state.batch_count, state.batch_start = 1, at(0)
    plan = due_commit(state, at(20_000), CFG)
    assert plan is not None
    record = held_commit(state, plan)
    assert record is not None and not record.sent and "rolled back" in record.trinity_response
    (rolled,) = state.rollout
    assert (rolled.share, rolled.rolled_back, rolled.version) == (0.0, True, 4)


def test_a_rollback_waits_for_an_operator_then_the_streak_starts_again() -> None:
    store = MemoryStore()
    ledger = run(store)
    resume = RoutingOverride(agent_name="support", requested_at=at(1000), requested_by="ops")
    state = ledger.feed([resume], 1000)
    assert state.holds == [] and not state.rollout[0].rolled_back
    assert ledger.routing[-1].action == "resume" and ledger.routing[-1].requested_by == "ops"
    pin = RoutingOverride(agent_name="support", share=0.25, requested_at=at(1001))
    state = ledger.feed([pin], 1001)
    assert (ledger.routing[-1].action, ledger.routing[-1].share) == ("set", 0.25)
    assert state.rollout[0].pinned and state.rollout[0].version == 6


def test_a_new_ledger_owner_keeps_the_rollout_state() -> None:
    uninterrupted = run(MemoryStore())
    restarted = run(MemoryStore(), restart_at=5)
    assert restarted.routing == uninterrupted.routing
    assert restarted.comparisons == uninterrupted.comparisons


def test_the_same_records_give_the_same_decisions() -> None:
    assert run(MemoryStore()).routing == run(MemoryStore()).routing


@pytest.mark.parametrize(
    ("verdicts", "shares"),
    [
        (["better", "better", "better", "better"], [0.1, 0.2, 0.3]),
        (["better", "inconclusive", "better", "better"], [0.1, 0.2]),  # streaks are consecutive
        (["better", "better", "insufficient"], [0.1, 0.2]),
        (["worse"], [0.1, 0.0]),
        (["better", "better", "worse", "better", "better"], [0.1, 0.2, 0.0]),  # hysteresis
        (["better"] * 10, [0.1, 0.2, 0.3]),  # bounded by max_share
    ],
)
def test_the_rule(verdicts: list[str], shares: list[float]) -> None:
    state = LedgerState()
    got = []
    for i, v in enumerate(verdicts):
        c = comparison(agent_name="a", verdict=v, window_start=at(60 * i))
        got += [r.share for r in decide_rollout(state, [c], [], at(60 * i + 70), ROLLOUT)]
    assert got == shares


def test_off_by_default_and_trailing_spans_decide_nothing() -> None:
    state = LedgerState()
    assert decide_rollout(state, [comparison()], [], at(0), RolloutConfig()) == []
    assert decide_rollout(state, [comparison(span="trailing")], [], at(0), ROLLOUT) == []
    assert state.rollout == []


def test_a_replay_of_the_closed_windows_reproduces_the_comparisons_and_decisions() -> None:
    live = run(MemoryStore())
    assert len(live.windows) == 2 * len(SCRIPT)  # per window: the policy's and production's
    replayed = replay_decisions(live.windows, live.alerts, CFG)
    assert replayed.comparisons == live.comparisons
    assert replayed.routing == live.routing
    stricter = dataclasses.replace(
        CFG, rollout=dataclasses.replace(ROLLOUT, promote_after=4)
    )  # the same traffic under other settings: one promotion fewer
    other = replay_decisions(live.windows, live.alerts, stricter)
    assert [r.action for r in other.routing] == ["start", "promote", "rollback"]


# -- per policy version, and the fallbacks ------------------------------------------------------


def cmp(verdict: str, version: int | None, span: str = "version", **kw: Any) -> Comparison:
    return comparison(agent_name="a", verdict=verdict, span=span, policy_version=version, **kw)


@pytest.mark.parametrize(
    ("window", "judged_one"),
    [
        ([cmp("better", None, "window")], 0),  # no version known: the window, pooled
        ([cmp("better", 3, "window")], 0),  # one version answered it all
        # several: the newest version with enough calls, though an older one won
        ([cmp("better", None, "window"), cmp("better", 3), cmp("worse", 4)], 2),
        ([cmp("better", None, "window"), cmp("better", 3), cmp("insufficient", 4)], 1),
        ([cmp("better", None, "window"), cmp("insufficient", 3), cmp("insufficient", 4)], 2),
    ],
)
def test_the_comparison_judged_in_a_window(window: list[Comparison], judged_one: int) -> None:
    trailing = cmp("better", None, "trailing")
    assert judged([*window, trailing]) == [window[judged_one]]


def run_rule(
    script: list[tuple[str, int | None]], cfg: RolloutConfig = ROLLOUT, rate: float = 0.0
) -> list[tuple[str, float, int | None]]:
    state = LedgerState()
    got = []
    for i, (verdict, version) in enumerate(script):
        c = comparison(
            agent_name="a",
            verdict=verdict,
            window_start=at(60 * i),
            policy_version=version,
            fallback_rate=rate,
        )
        got += [
            (r.action, r.share, r.policy_version)
            for r in decide_rollout(state, [c], [], at(60 * i + 70), cfg)
        ]
    return got


@pytest.mark.parametrize(
    ("script", "changes"),
    [
        ([("better", 1), ("better", 1)], [("start", 0.1, 1), ("promote", 0.2, 1)]),
        # a win of a new version starts a new streak: the version promoted must have won it
        ([("better", 1), ("better", 2)], [("start", 0.1, 1)]),
        (
            [("better", 1), ("better", 2), ("better", 2)],
            [("start", 0.1, 1), ("promote", 0.2, 2)],
        ),
        ([("better", 1), ("worse", 2)], [("start", 0.1, 1), ("rollback", 0.0, 2)]),
        # with no version known, streaks are what they were
        ([("better", None), ("better", None)], [("start", 0.1, None), ("promote", 0.2, None)]),
    ],
)
def test_wins_count_per_version_and_a_rollback_names_the_version(
    script: list[tuple[str, int | None]], changes: list[tuple[str, float, int | None]]
) -> None:
    assert run_rule(script) == changes


def test_losses_count_whatever_the_version() -> None:
    slow = dataclasses.replace(ROLLOUT, rollback_after=2)
    got = run_rule([("better", 1), ("worse", 1), ("worse", 2)], slow)
    assert got == [("start", 0.1, 1), ("rollback", 0.0, 2)]


def test_no_promotion_while_the_policy_falls_back_too_often() -> None:
    state = LedgerState()
    changes: list[RoutingShare] = []
    for i, rate in enumerate([0.3, 0.3, 0.05, 0.05]):
        c = comparison(
            agent_name="a",
            window_start=at(60 * i),
            policy_version=7,
            policy_fallbacks=int(rate * 100),
            fallback_rate=rate,
        )
        changes += decide_rollout(state, [c], [], at(60 * i + 70), ROLLOUT)
    assert [(r.action, r.share, r.version) for r in changes] == [
        ("start", 0.1, 1),
        ("blocked", 0.1, 2),  # better twice, but 30 % fell back: the share stays, and says why
        ("promote", 0.2, 3),  # two new wins at 5 %
    ]
    blocked = changes[1]
    assert "30.0% of the calls routed to the policy fell back" in blocked.reason
    assert "gateway.rollout.max_fallback_rate 10.0%" in blocked.reason
    assert blocked.policy_version == 7 and [e.fallback_rate for e in blocked.evidence] == [0.3] * 2


def test_a_drift_rollback_names_the_version_last_judged() -> None:
    state = LedgerState()
    decide_rollout(state, [cmp("better", 5, "window")], [], at(70), ROLLOUT)
    alert = DriftAlert(
        agent_name="a",
        model="m",
        window_start=at(60),
        window_end=at(120),
        mean=0.1,
        trailing_mean=0.8,
        trailing_windows=3,
        fraction=0.8,
        raised_at=at(130),
    )
    window = cmp("inconclusive", 6, "window", window_start=at(60))
    (change,) = decide_rollout(state, [window], [alert], at(130), ROLLOUT, {"a": {"m"}})
    assert (change.action, change.policy_version) == ("drift", 6)


def version_acks(
    i: int, versions: dict[int, tuple[int, float]], fallbacks: int, rng: random.Random
) -> list[AvroModel]:
    """Window ``i``: per policy version (calls, mean quality), ``fallbacks`` calls routed to the
    policy that production answered, and 40 production calls at 0.5."""
    calls: list[tuple[str, int | None, float]] = [
        ("trinity", v, q) for v, (n, q) in versions.items() for _ in range(n)
    ]
    calls += [("trinity-fallback", None, 0.5)] * fallbacks + [("production", None, 0.5)] * 40
    acks: list[AvroModel] = []
    for n, (upstream, version, mean) in enumerate(calls):
        r = rewarded(
            f"w{i}-{n}",
            min(1.0, max(0.0, rng.gauss(mean, 0.15))),
            agent_name="support",
            model="policy" if upstream == "trinity" else "gpt",
            upstream=upstream,
            policy_version=version,
            msg_ids=[f"chatcmpl-w{i}-{n}"] if upstream == "trinity" else [],
            event_time=at(WINDOW * i + n * 0.5),
        )
        acks.append(FeedbackAck(rewarded=r, acked_at=at(WINDOW * i + 30), feedbacks=1))
    return acks


VERSION_SCRIPT: list[tuple[dict[int, tuple[int, float]], int]] = [
    ({1: (20, 0.8)}, 0),
    ({1: (20, 0.8)}, 8),  # the second win, but 8 of 28 fell back: blocked
    ({1: (20, 0.8)}, 0),
    ({1: (20, 0.8)}, 0),  # two more wins: promoted
    ({1: (20, 0.8), 2: (12, 0.2)}, 0),  # version 2 arrives, worse: rolled back, named
]


def test_the_rollout_judges_the_newest_version_and_counts_fallbacks() -> None:
    rng = random.Random(50)
    ledger = Ledger(MemoryStore())
    for i, (versions, fallbacks) in enumerate(VERSION_SCRIPT):
        ledger.feed(version_acks(i, versions, fallbacks, rng), WINDOW * i + 40)
    ledger.feed([], WINDOW * len(VERSION_SCRIPT) + 40)
    # the policy's windows are kept per version; production's and the fallbacks' are not
    last = [w for w in ledger.windows if w.window_start == at(WINDOW * 4)]
    assert sorted((w.upstream, w.policy_version, w.count) for w in last) == [
        ("production", None, 40),
        ("trinity", 1, 20),
        ("trinity", 2, 12),
    ]
    windows = [c for c in ledger.comparisons if c.span == "window"]
    assert [c.policy_fallbacks for c in windows] == [0, 8, 0, 0, 0]
    assert [c.policy_version for c in windows] == [1, 1, 1, 1, None]  # the last: two versions
    assert windows[1].fallback_rate == pytest.approx(8 / 28)
    # pooled, the last window would not show the new version losing; on its own, it does
    assert windows[4].verdict != "worse"
    per_version = {c.policy_version: c.verdict for c in ledger.comparisons if c.span == "version"}
    assert per_version == {1: "better", 2: "worse"}
    steps = [(r.action, r.share, r.policy_version) for r in ledger.routing]
    assert steps == [
        ("start", 0.1, 1),
        ("blocked", 0.1, 1),
        ("promote", 0.2, 1),
        ("rollback", 0.0, 2),
    ]
    rollback = ledger.routing[-1]
    assert "policy version 2" in rollback.reason
    assert [(e.span, e.policy_version) for e in rollback.evidence] == [("version", 2)]
    # the same decisions from the closed windows (trajstream compare --replay)
    replayed = replay_decisions(ledger.windows, ledger.alerts, CFG)
    assert replayed.comparisons == ledger.comparisons
    assert replayed.routing == ledger.routing
