"""Commit holds (``commit.hold_on_drift``), table-driven through the ledger stage: a drift
alert holds commits, a later window at or above the threshold or an operator's CommitResume
ends the hold, a commit due while held is recorded (not sent), and the hold is ledger state
that a restarted stage reads back."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from streams.core.commits import write_ahead_commit
from streams.core.effects import Source
from streams.core.ledger import LedgerConfig, is_held
from streams.core.ledger_stage import LedgerStage
from streams.core.store import MemoryStore
from streams.models import AvroModel, CommitRecord, CommitResume, LedgerState
from tests.unit.core.harness import CODEC, EDGE, Core, ScriptedTrinity, m
from tests.unit.factories import ack, at

WINDOW = 10
MODEL = ack().rewarded.model


def cfg(hold: bool = True) -> LedgerConfig:
    return LedgerConfig(
        interval=timedelta(seconds=1000),
        window=timedelta(seconds=WINDOW),
        grace=timedelta(seconds=1),
        drift_fraction=0.8,
        hold_on_drift=hold,
    )


class Ledger:
    """A ledger stage over a memory store, fed record by record at explicit times."""

    def __init__(self, config: LedgerConfig, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore()
        self.stage = LedgerStage(config, store=self.store, codec=CODEC)
        self.offset = 0
        self.alerts = 0

    def feed(self, record: AvroModel, now: float) -> LedgerState:
        state = self.stage.load()
        self.offset = max(self.offset, state.applied_offset) + 1
        src = EDGE.read(Source("ledger", 0, self.offset, None, CODEC.encode(record)))
        self.stage.apply(state, [src], at(now))
        out, _ = self.stage.decide(state, at(now), final=False)
        self.alerts += len(out.records("alerts"))
        self.stage.save(state)
        return state

    def window(self, i: int, mean: float, agent: str = "a") -> LedgerState:
        """One acknowledgement of reward ``mean`` in window ``i`` (closes window ``i - 1``)."""
        t = WINDOW * i + 5
        return self.feed(ack(f"{agent}-{i}", mean, event_time=at(t), agent_name=agent), t)

    def held(self) -> list[str]:
        return [f"{h.agent_name}|{h.model}" for h in self.stage.load().holds]


@pytest.mark.parametrize(
    ("means", "hold_on_drift", "held_after"),
    [
        # two good windows, a drop (held), still low, recovered (threshold 0.8 x 1.0)
        ([1.0, 1.0, 0.2, 0.5, 0.9], True, [False, False, True, True, False]),
        # the setting off: the alert is raised, nothing is held
        ([1.0, 1.0, 0.2, 0.5, 0.9], False, [False] * 5),
        # exactly at the threshold recovers
        ([1.0, 1.0, 0.2, 0.8], True, [False, False, True, False]),
        # just below it does not; a second drop keeps the first threshold
        ([1.0, 1.0, 0.2, 0.1, 0.79], True, [False, False, True, True, True]),
        # no drift without two earlier windows
        ([1.0, 0.1], True, [False, False]),
    ],
)
def test_a_drop_holds_and_a_recovery_resumes(
    means: list[float], hold_on_drift: bool, held_after: list[bool]
) -> None:
    ledger = Ledger(cfg(hold_on_drift))
    seen = []
    for i, mean in enumerate([*means, 0.0]):  # the last window only closes the one before
        ledger.window(i, mean)
        if i:
            seen.append(bool(ledger.held()))
    assert seen == held_after
    assert ledger.alerts >= (1 if any(held_after) else 0)


def test_a_hold_threshold_is_the_fraction_of_the_trailing_mean() -> None:
    ledger = Ledger(cfg())
    for i, mean in enumerate([1.0, 0.5, 0.1, 0.0]):
        ledger.window(i, mean)
    (hold,) = ledger.stage.load().holds
    assert (hold.agent_name, hold.model, hold.mean) == ("a", MODEL, 0.1)
    assert hold.threshold == pytest.approx(0.8 * 0.75)
    assert hold.window_start == at(2 * WINDOW)


def test_another_agents_good_window_does_not_end_a_hold() -> None:
    ledger = Ledger(cfg())
    for i, mean in enumerate([1.0, 1.0, 0.1]):
        ledger.window(i, mean, agent="a")
    ledger.window(3, 1.0, agent="b")
    ledger.window(4, 1.0, agent="b")
    assert ledger.held() == [f"a|{MODEL}"]


def resume(agent: str | None = None, model: str | None = None) -> CommitResume:
    return CommitResume(agent_name=agent, model=model, requested_at=at(500), requested_by="ops")


@pytest.mark.parametrize(
    ("request_", "left"),
    [
        (resume(), []),
        (resume("a"), [f"b|{MODEL}"]),
        (resume("a", MODEL), [f"b|{MODEL}"]),
        (resume(model=MODEL), []),
        (resume("c"), [f"a|{MODEL}", f"b|{MODEL}"]),
        (resume("a", "llama"), [f"a|{MODEL}", f"b|{MODEL}"]),
    ],
)
def test_an_operator_resume_ends_the_holds_it_names(
    request_: CommitResume, left: list[str]
) -> None:
    ledger = Ledger(cfg())
    for i, (a, b) in enumerate([(1.0, 1.0), (1.0, 1.0), (0.1, 0.1)]):
        ledger.window(2 * i, a, agent="a")
        ledger.window(2 * i + 1, b, agent="b")
    ledger.window(6, 0.0, agent="a")
    assert ledger.held() == [f"a|{MODEL}", f"b|{MODEL}"]
    ledger.feed(request_, 65)  # not idle: window 6 stays open
    assert ledger.held() == left


def commit_at(ledger: Ledger, now: float, trinity: ScriptedTrinity) -> CommitRecord | None:
    state = ledger.stage.load()
    _, plan = ledger.stage.decide(state, at(now), final=False)
    assert plan is not None

    async def write_ahead(s: LedgerState) -> None:
        ledger.stage.save(s)

    record = asyncio.run(write_ahead_commit(state, plan, trinity, write_ahead))
    ledger.stage.save(state)
    return record


def test_a_commit_due_while_held_is_recorded_not_sent_and_resumes_after_a_restart() -> None:
    ledger = Ledger(cfg())
    for i, mean in enumerate([1.0, 1.0, 0.2, 0.0]):
        ledger.window(i, mean)
    assert ledger.held() == [f"a|{MODEL}"]

    trinity = ScriptedTrinity([])
    held = commit_at(ledger, 1000, trinity)
    assert held is not None and not held.sent and is_held(held)
    assert trinity.calls == []  # nothing asked of Trinity while held
    assert held.feedback_count == 4 and held.experiences == 0
    assert f"reward drop of a/{MODEL}" in held.trinity_response
    assert ledger.stage.load().batch_count == 0

    # a new stage over the same store (a restart or a rebalance): the hold is still there
    restarted = Ledger(cfg(), ledger.store)
    assert restarted.held() == [f"a|{MODEL}"]
    restarted.feed(resume("a"), 1001)
    assert restarted.held() == []
    restarted.feed(ack("after", 1.0, event_time=at(1001), agent_name="a"), 1001)
    trinity = ScriptedTrinity([m(0, 5), m(0, 5)])
    sent = commit_at(restarted, 2000, trinity)
    assert sent is not None and sent.sent and not is_held(sent)
    assert trinity.calls == ["metrics", "metrics", "commit"]
    assert sent.commit_seq == held.commit_seq + 1
    assert sent.experiences == 5  # the held intervals' feedbacks are drained now


def test_a_redelivered_resume_is_applied_once() -> None:
    ledger = Ledger(cfg())
    for i, mean in enumerate([1.0, 1.0, 0.2, 0.0]):
        ledger.window(i, mean)
    state = ledger.stage.load()
    src = EDGE.read(Source("ledger", 0, state.applied_offset + 1, None, CODEC.encode(resume())))
    applied = ledger.stage.apply(state, [src, src], at(600))
    assert applied.out.stats["ledger.holds_resumed"] == 1
    assert applied.out.stats["ledger.reapplied"] == 1


def test_a_resume_is_accepted_only_on_the_ledger() -> None:
    core = Core()
    core.event(resume(), at(1), key=b"x")
    core.feedback(resume(), at(1))
    reasons = [reason for _, reason in core.rejects()]
    assert len(reasons) == 2
    assert all("io.trajstream.CommitResume does not belong on" in r for r in reasons)


def test_held_commit_records_are_told_apart_from_nothing_ready() -> None:
    from streams.core.commits import NOT_SENT

    record = CommitRecord(
        commit_seq=1, interval_start=at(0), interval_end=at(1), feedback_count=0
    )
    assert not is_held(record)
    assert not is_held(record.model_copy(update={"sent": False, "trinity_response": NOT_SENT}))
    assert not is_held(record.model_copy(update={"sent": False, "trinity_response": "oops"}))


def test_turning_the_setting_off_ends_the_holds() -> None:
    ledger = Ledger(cfg())
    for i, mean in enumerate([1.0, 1.0, 0.2, 0.0]):
        ledger.window(i, mean)
    assert ledger.held()
    restarted = Ledger(cfg(hold=False), ledger.store)  # a restart with hold_on_drift off
    state = restarted.stage.load()
    restarted.stage.decide(state, at(36), final=False)
    assert state.holds == []
