"""The assemble stage driven with in-memory stores and a fake clock: closing, abandonment,
late events, bad records. Table-driven; every time is seconds after T0."""

from __future__ import annotations

from datetime import timedelta

import pytest

from streams.core.effects import Source
from streams.models import SelectionDecision, Trajectory
from tests.unit.core.harness import EDGE, Core, tick_record
from tests.unit.factories import at, end, feedback, start, step


def closed_reasons(core: Core) -> list[str]:
    return [d.closed_reason for d in core.topic("decisions") if isinstance(d, SelectionDecision)]


@pytest.mark.parametrize(
    ("events", "tick_at", "expected"),
    [
        # (record, seconds it is read at) ...; tick time; closed reasons after the tick
        ([(start(), 0), (step(seq=0), 1), (end(step_count=1), 2)], None, ["ended"]),
        ([(start(), 0), (step(seq=0), 1)], 59, []),
        ([(start(), 0), (step(seq=0), 1)], 60.001, ["abandoned: no end event"]),
        ([(start(), 0), (end(step_count=2), 1), (step(seq=0), 2)], 30, []),
        (
            [(start(), 0), (end(step_count=2), 1), (step(seq=0), 2)],
            61,
            ["abandoned: 1 of 2 steps arrived"],
        ),
        # a step after the END still joins: the END said how many to wait for
        ([(start(), 0), (end(step_count=1), 1), (step(seq=0), 5)], None, ["ended"]),
    ],
)
def test_calls_close_when_complete_or_abandoned_on_the_clock(
    events: list, tick_at: float | None, expected: list[str]
) -> None:
    core = Core()
    for record, seconds in events:
        core.event(record, at(seconds))
    if tick_at is not None:
        core.tick(at(tick_at))
    assert closed_reasons(core) == expected


def test_a_tick_exactly_at_the_deadline_closes_at_the_next_tick() -> None:
    core = Core()
    core.event(start(), at(0))
    core.tick(at(60))  # not strictly later than abandon_after: still open
    assert closed_reasons(core) == []
    core.tick(at(60.5))
    assert closed_reasons(core) == ["abandoned: no end event"]


@pytest.mark.parametrize(
    ("late_at", "late"),
    [(10, True), (119, True), (200, False)],  # retention is 120 s after closing at 2 s
)
def test_an_event_after_its_call_closed_is_late_until_the_retention_ends(
    late_at: float, late: bool
) -> None:
    core = Core()
    for record, seconds in [(start(), 0), (step(seq=0), 1), (end(step_count=1), 2)]:
        core.event(record, at(seconds))
    core.tick(at(late_at))
    out = core.event(step(seq=0), at(late_at))  # redelivered after a crash, say
    if late:
        assert [r.stage for r in out.rejects] == ["late"]
        assert "arrived after call call-1 closed" in out.rejects[0].reason
        assert out.emits == []
    else:  # forgotten: a new open call, not a late event
        assert out.rejects == []
        assert core.pending.get(b"call-1") is not None


@pytest.mark.parametrize(
    ("record", "key", "reason"),
    [
        (start(), b"other", "record key b'other' is not its call_id 'call-1'"),
        (feedback(), None, "io.trajstream.UserFeedback does not belong on agent-events"),
    ],
)
def test_bad_records_are_dead_letters_of_the_stage(record, key, reason: str) -> None:  # type: ignore[no-untyped-def]
    core = Core()
    out = core.event(record, at(0), key=key)
    assert [(r.stage, r.reason[: len(reason)]) for r in out.rejects] == [("assemble", reason)]


def test_undecodable_bytes_are_a_dead_letter_not_an_exception() -> None:
    core = Core()
    src = core.source("agent-events", start())
    broken = EDGE.read(Source(src.topic or "", 0, 9, b"call-1", b"\x00garbage"))
    out = core.assembler.on_record(broken, at(0))
    assert [r.stage for r in out.rejects] == ["assemble"]


def test_duplicate_events_count_once_and_a_reused_seq_is_a_dead_letter() -> None:
    core = Core()
    core.event(start(), at(0))
    core.event(start(), at(0.5))
    out = core.event(step(seq=0, event_id="other"), at(1))
    assert out.rejects == []
    out = core.event(step(seq=0, event_id="again"), at(1.5))
    assert "arrived twice with different event ids" in out.rejects[0].reason
    core.event(end(step_count=1), at(2))
    (trajectory,) = core.topic("trajectories")
    assert isinstance(trajectory, Trajectory)
    assert [s.event_id for s in trajectory.steps] == ["other"]


def test_only_the_ticks_topic_moves_the_clock() -> None:
    core = Core(late_retention=timedelta(seconds=5))
    core.event(start(), at(0))
    out = core.event(tick_record(at(61)), at(1), key=b"call-1")  # a Tick on agent-events
    assert [r.reason for r in out.rejects] == [
        "io.trajstream.Tick does not belong on agent-events"
    ]
    assert closed_reasons(core) == []
    src = core.source("ticks", tick_record(at(61)))
    core.assembler.on_record(src, at(2))
    assert core.pending.get(b"call-1") is None  # closed as abandoned by the real clock


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_stage_that_does_not_wake_has_nothing_to_do_on_a_tick(seed: int) -> None:
    # replay ticks at every record and asks wakes() first: whenever a stage says it would not
    # wake, its tick must decide nothing (calls abandoned, late ones forgotten, grace periods
    # ended, feedback that waited too long all happen only on ticks that wake)
    import random

    from streams.core.rewards import build_rewarder

    rng = random.Random(seed)
    core = Core(
        rewarder=build_rewarder("streams.rewards:user_rating"),
        feedback_grace=timedelta(seconds=5),
        late_retention=timedelta(seconds=30),
    )
    woke = {"assemble": 0, "reward": 0}
    for i in range(400):
        now = at(i * 0.5)
        for name, stage in (("assemble", core.assembler), ("reward", core.join)):
            wakes = stage.wakes(0, now)
            stores = [dict(s.data) for s in (core.pending, core.closed, core.awaiting)]
            out = stage.on_tick(0, now)
            decided = out.emits or out.rejects or +out.stats or getattr(out, "scored", None)
            changed = stores != [s.data for s in (core.pending, core.closed, core.awaiting)]
            assert wakes or not (decided or changed), (name, i, out)
            woke[name] += bool(decided or changed)
            core._record(out)
        cid = f"call-{rng.randint(0, 60)}"
        match rng.randint(0, 5):
            case 0:
                core.event(start(cid), now)
            case 1 | 2:
                core.event(step(cid, seq=rng.randint(0, 2)), now)
            case 3:
                core.event(end(cid, step_count=rng.randint(0, 3)), now)
            case 4:
                core.feedback(feedback(cid, event_id=f"{cid}/fb{i}", event_time=now), now)
            case _:
                pass  # time passes
    assert woke["assemble"] and woke["reward"]  # ticks that decided something were checked
