"""The rollout through the ledger stage, table-driven and scripted: a stand-in policy whose
rewards depend on its model version (better than production, then worse) against production's
fixed rewards. The share rises in bounded steps while the policy wins with confidence, rolls
back on the first confident loss and holds commits until an operator resumes; a restarted
ledger stage (a new owner over the same store) keeps it all; the same records give the same
decisions again."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta

import pytest

from streams.core.compare import CompareConfig
from streams.core.ledger import LedgerConfig, due_commit, held_commit
from streams.core.ledger_stage import LedgerStage
from streams.core.rollout import RolloutConfig, decide_rollout
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
