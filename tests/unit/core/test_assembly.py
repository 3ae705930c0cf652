"""Unit tests of streams.core.assembly: applying events to a call, closing it, the trajectory."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.assembly import (
    Applied,
    Limits,
    add_event,
    close,
    closed_reason,
    new_pending,
    task_id_for,
)
from streams.core.select import CallView, ExplicitMark, SamplingRate
from streams.models import AgentCall, ChatMessage, Completion, PendingCall, Selection, StepKind
from tests.unit.factories import T0, at, end, mark, start, step

ALL = SamplingRate(1.0)
NONE = SamplingRate(0.0)
LIMITS = Limits(max_steps=5, max_bytes=1000, abandon_after=timedelta(minutes=10))


def pending(
    *events: AgentCall | Completion, size: int = 10, call_id: str = "call-1"
) -> PendingCall:
    state = new_pending(call_id, T0)
    for event in events:
        add_event(state, event, size)
    return state


class Recording:
    """Selects everything and remembers what it was shown."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[CallView] = []

    def decide(self, call: CallView) -> Selection:
        self.seen.append(call)
        return Selection(selected=True, strategy=self.name, reason="yes")


# -- add_event -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "event",
    [start(), end(), step(seq=0), step(seq=3, kind=StepKind.TOOL)],
    ids=["start", "end", "llm-step", "tool-step"],
)
def test_same_event_id_twice_is_a_duplicate_and_changes_nothing(event: Any) -> None:
    state = new_pending("call-1", T0)
    assert add_event(state, event, 100) is Applied.ADDED
    before = state.model_dump()
    assert add_event(state, event, 100) is Applied.DUPLICATE
    assert (
        add_event(
            state,
            event.model_copy(
                update={"output": "x"} if isinstance(event, AgentCall) else {"latency_ms": 1.0}
            ),
            100,
        )
        is Applied.DUPLICATE
    )
    assert state.model_dump() == before
    assert state.bytes == 100


def test_second_start_or_end_with_another_event_id_is_a_duplicate() -> None:
    state = pending(start(), end())
    before = state.model_dump()
    assert add_event(state, start(event_id="other-start", agent_name="x"), 10) is Applied.DUPLICATE
    assert add_event(state, end(event_id="other-end", output="x"), 10) is Applied.DUPLICATE
    assert state.model_dump() == before


def test_duplicate_seq_with_another_event_id_keeps_the_first() -> None:
    state = pending(step(seq=1, response_id="first"))
    before = state.model_dump()
    assert add_event(state, step(seq=1, event_id="other", response_id="second"), 10) is (
        Applied.DUPLICATE_SEQ
    )
    assert state.model_dump() == before
    assert [s.response_id for s in state.steps] == ["first"]


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1], [1, 3, 0, 2]])
def test_steps_are_ordered_by_seq_whatever_the_arrival(order: list[int]) -> None:
    state = pending(*(step(seq=seq * 10) for seq in order))
    assert [s.seq for s in state.steps] == [0, 10, 20, 30]


def test_bytes_add_up_over_added_events_only() -> None:
    state = new_pending("call-1", T0)
    add_event(state, start(), 100)
    add_event(state, step(seq=0), 250)
    add_event(state, step(seq=0), 250)  # duplicate
    add_event(state, step(seq=0, event_id="x"), 250)  # duplicate seq
    add_event(state, end(), 50)
    assert state.bytes == 400


# -- closed_reason ---------------------------------------------------------------------------

ABANDON = LIMITS.abandon_after


@pytest.mark.parametrize(
    ("events", "size", "elapsed", "expected"),
    [
        ([start()], 10, timedelta(seconds=1), None),
        ([start(), step(seq=0)], 10, ABANDON, None),  # exactly the timeout: still open
        ([start(), end()], 10, timedelta(0), "ended"),
        ([end()], 10, timedelta(0), None),  # waits for its start
        ([end()], 10, ABANDON + timedelta(seconds=1), "abandoned: no start event"),
        ([step(seq=0), end(step_count=1)], 10, timedelta(0), None),
        ([step(seq=0), end(step_count=1), start()], 10, timedelta(0), "ended"),  # start last
        (
            [start(), step(seq=0), step(seq=1), end(step_count=1)],
            10,
            timedelta(0),
            "inconsistent: 2 steps arrived, the end event counts 1",
        ),
        ([start(), end(step_count=0)], 10, timedelta(0), "ended"),
        ([start(), step(seq=0), end(step_count=2)], 10, timedelta(seconds=1), None),
        ([start(), step(seq=0), step(seq=1), end(step_count=2)], 10, timedelta(0), "ended"),
        ([start(), step(seq=1), end(step_count=2), step(seq=0)], 10, timedelta(0), "ended"),
        (
            [start(), step(seq=0), step(seq=1), end(step_count=1)],
            10,
            timedelta(0),
            "inconsistent: 2 steps arrived, the end event counts 1",
        ),
        ([start()], 10, ABANDON + timedelta(milliseconds=1), "abandoned: no end event"),
        ([start(), step(seq=0)], 10, timedelta(hours=1), "abandoned: no end event"),
        (
            [start(), step(seq=0), end(step_count=3)],
            10,
            ABANDON + timedelta(seconds=1),
            "abandoned: 1 of 3 steps arrived",
        ),
        ([start(), *(step(seq=i) for i in range(5))], 10, timedelta(0), None),  # at the limit
        (
            [start(), *(step(seq=i) for i in range(6))],
            10,
            timedelta(0),
            "oversized: more than 5 steps",
        ),
        (
            [start(), *(step(seq=i) for i in range(6)), end()],
            10,
            timedelta(0),
            "oversized: more than 5 steps",
        ),
        ([start(), step(seq=0)], 500, timedelta(0), None),  # 1000 bytes: at the limit
        ([start(), step(seq=0), step(seq=1)], 400, timedelta(0), "oversized: more than 1000 bytes"),
    ],
    ids=[
        "open",
        "open-at-timeout",
        "ended",
        "end-waits-for-start",
        "abandoned-no-start",
        "steps-and-end-wait-for-start",
        "start-last",
        "end-counts-fewer-steps",
        "ended-zero-steps",
        "waiting-for-steps",
        "ended-all-steps",
        "ended-steps-after-end",
        "more-steps-than-said",
        "abandoned-no-end",
        "abandoned-no-end-with-steps",
        "abandoned-missing-steps",
        "max-steps",
        "oversized-steps",
        "oversized-steps-with-end",
        "max-bytes",
        "oversized-bytes",
    ],
)
def test_closed_reason(
    events: list[Any], size: int, elapsed: timedelta, expected: str | None
) -> None:
    state = pending(*events, size=size)
    assert closed_reason(state, T0 + elapsed, LIMITS) == expected


# -- close -----------------------------------------------------------------------------------


def test_selected_call_becomes_a_trajectory() -> None:
    the_mark = mark(task_id="task-42", run_id=7, marked_at=at(0))
    state = pending(
        step(seq=2, response_id="r2"),
        start(mark=the_mark),
        step(seq=1, kind=StepKind.TOOL, response_id="tool-id"),
        step(seq=0, response_id="r0"),
        step(seq=3, response_id=None),
        end(step_count=4, output="Paris.", error_type=None),
    )
    selection, traj = close(state, ExplicitMark(), "ended")
    assert selection == Selection(selected=True, strategy="marked(ttl=60s)", reason="marked")
    assert traj is not None
    assert traj.msg_ids == ["r0", "r2"]
    assert [s.seq for s in traj.steps] == [0, 1, 2, 3]
    assert (traj.trajectory_id, traj.call_id, traj.task_id, traj.run_id) == (
        "call-1",
        "call-1",
        "task-42",
        7,
    )
    assert traj.mark == the_mark
    assert traj.selection == selection
    assert traj.input_messages == start().input_messages
    assert (traj.output, traj.status) == ("Paris.", end().status)
    assert (traj.started_at, traj.ended_at) == (start().event_time, end().event_time)
    assert (traj.agent_id, traj.agent_name, traj.agent_version, traj.conversation_id) == (
        "agent-7",
        "researcher",
        "1.2.0",
        "conv-1",
    )
    assert traj.closed_reason == "ended"
    assert traj.feedback == []


def test_trajectory_without_start_uses_the_end() -> None:
    messages = [ChatMessage(role="user", content="from the end")]
    _, traj = close(pending(end(input_messages=messages)), ALL, "ended")
    assert traj is not None
    assert traj.started_at is None
    assert traj.input_messages == messages
    assert traj.agent_id is None


@pytest.mark.parametrize(
    ("the_mark", "task_id", "run_id"),
    [
        (None, "task-call-1", 0),
        (mark(task_id=None, run_id=None), "task-call-1", 0),
        (mark(task_id="t-1", run_id=None), "t-1", 0),
        (mark(task_id=None, run_id=3), "task-call-1", 3),
        (mark(task_id="t-2", run_id=0), "t-2", 0),
    ],
)
def test_task_id_and_run_id_come_from_the_mark(the_mark: Any, task_id: str, run_id: int) -> None:
    _, traj = close(pending(start(), end(mark=the_mark)), ALL, "ended")
    assert traj is not None
    assert (traj.task_id, traj.run_id) == (task_id, run_id)


@pytest.mark.parametrize("length", [1, 58, 59, 60, 64, 200, 5000])
def test_task_id_fits_64_characters(length: int) -> None:
    call_id = "c" * length
    _, traj = close(pending(end(call_id), call_id=call_id), ALL, "ended")
    assert traj is not None
    assert len(traj.task_id) <= 64
    if length <= 59:
        assert traj.task_id == f"task-{call_id}"
    else:
        assert traj.task_id == "task-" + hashlib.sha256(call_id.encode()).hexdigest()[:40]
    assert traj.trajectory_id == call_id


def test_long_call_ids_keep_distinct_task_ids() -> None:
    a, b = "x" * 100 + "a", "x" * 100 + "b"
    assert task_id_for(CallView(a, None, end(a))) != task_id_for(CallView(b, None, end(b)))


def test_not_selected_gives_no_trajectory() -> None:
    selection, traj = close(pending(start(), end()), NONE, "ended")
    assert traj is None
    assert selection == Selection(selected=False, strategy="sampling(0)", reason="not-sampled")


@pytest.mark.parametrize(
    ("reason", "why"),
    [("abandoned: no end event", "abandoned"), ("oversized: more than 5 steps", "oversized")],
)
def test_a_call_closed_without_its_end_keeps_what_it_had(reason: str, why: str) -> None:
    strategy = Recording()
    selection, traj = close(pending(start(mark=mark()), step(seq=0)), strategy, reason)
    assert selection.selected
    assert traj is not None
    assert traj.closed_reason == reason and traj.closed_reason.startswith(why)
    assert traj.status is None and traj.output is None
    assert [s.seq for s in traj.steps] == [0]
    assert traj.ended_at == step(seq=0).event_time  # the last event's time
    assert len(strategy.seen) == 1 and strategy.seen[0].end is None


def test_strategy_sees_the_model_of_the_last_llm_step() -> None:
    strategy = Recording()
    close(
        pending(
            start(),
            step(seq=0, response_model="m0"),
            step(seq=1, response_model=None, request_model="m1-requested"),
            step(seq=2, kind=StepKind.TOOL),
            end(),
        ),
        strategy,
        "ended",
    )
    assert strategy.seen[0].model == "m1-requested"
    assert strategy.seen[0].call_id == "call-1"


def test_oversized_call_with_an_end_is_still_decided() -> None:
    state = pending(start(), *(step(seq=i) for i in range(6)), end())
    reason = closed_reason(state, T0, LIMITS)
    assert reason is not None
    _, traj = close(state, ALL, reason)
    assert traj is not None
    assert traj.closed_reason == "oversized: more than 5 steps"


# -- property: arrival order and redelivery do not matter ------------------------------------


@st.composite
def call_events(draw: st.DrawFn) -> tuple[list[AgentCall | Completion], list[int]]:
    n = draw(st.integers(0, 6))
    kinds = draw(st.lists(st.sampled_from(StepKind), min_size=n, max_size=n))
    seqs = sorted(draw(st.sets(st.integers(0, 1000), min_size=n, max_size=n)))
    with_start = draw(st.booleans())
    with_count = draw(st.booleans())
    the_mark = draw(st.none() | st.just(mark(task_id="task-m", run_id=2)))
    events: list[AgentCall | Completion] = [
        step("c", seq, kind=kind, event_id=f"s{seq}") for seq, kind in zip(seqs, kinds, strict=True)
    ]
    events.append(end("c", step_count=n if with_count else None, mark=the_mark))
    if with_start:
        events.append(start("c"))
    arrivals = list(range(len(events))) + draw(
        st.lists(st.integers(0, len(events) - 1), max_size=len(events))
    )
    return events, draw(st.permutations(arrivals))


@settings(max_examples=200, deadline=None)
@given(case=call_events())
def test_any_arrival_order_with_duplicates_gives_the_same_trajectory(
    case: tuple[list[AgentCall | Completion], list[int]],
) -> None:
    events, arrivals = case
    in_order = new_pending("c", T0)
    for event in events:
        assert add_event(in_order, event, 10) is Applied.ADDED
    _, expected = close(in_order, ALL, "ended")
    assert expected is not None

    state = new_pending("c", T0)
    seen: set[int] = set()
    for index in arrivals:
        applied = add_event(state, events[index], 10)
        assert applied is (Applied.DUPLICATE if index in seen else Applied.ADDED)
        seen.add(index)
    _, traj = close(state, ALL, "ended")
    assert traj is not None
    assert traj.model_dump() == expected.model_dump()
    assert state.bytes == 10 * len(events)
    assert [s.seq for s in traj.steps] == sorted(s.seq for s in traj.steps)


@settings(max_examples=100, deadline=None)
@given(case=call_events())
def test_call_closes_as_ended_exactly_when_everything_has_arrived(
    case: tuple[list[AgentCall | Completion], list[int]],
) -> None:
    events, arrivals = case
    the_end = next(e for e in events if isinstance(e, AgentCall) and e.phase.value == "END")
    needed = (
        {i for i, e in enumerate(events) if isinstance(e, Completion)}
        if the_end.step_count is not None
        else set()
    )
    needed.add(events.index(the_end))
    starts = [i for i, e in enumerate(events) if isinstance(e, AgentCall) and e is not the_end]
    needed.update(starts)  # no START: the call never ends, it is abandoned
    state = new_pending("c", T0)
    seen: set[int] = set()
    for index in arrivals:
        add_event(state, events[index], 10)
        seen.add(index)
        reason = closed_reason(state, T0, Limits())
        assert (reason == "ended") == (bool(starts) and needed.issubset(seen))
        assert reason in (None, "ended")


@settings(max_examples=200, deadline=None)
@given(case=call_events())
def test_closing_at_the_first_reason_joins_every_event_whatever_the_order(
    case: tuple[list[AgentCall | Completion], list[int]],
) -> None:
    """As the worker does it: close at the first reason; what comes after is late. With its
    START, every permutation (START last included) closes once, as ``ended``, with nothing
    late, and gives the trajectory of the in-order arrival."""
    events, arrivals = case
    if not any(isinstance(e, AgentCall) and e.phase.value == "START" for e in events):
        return
    if any(isinstance(e, AgentCall) and e.phase.value == "END" and e.step_count is None
           for e in events):
        return  # an END that does not count its steps closes the call with what has arrived
    in_order = new_pending("c", T0)
    for event in events:
        add_event(in_order, event, 10)
    _, expected = close(in_order, ALL, "ended")
    state = new_pending("c", T0)
    reason = None
    late = []
    for index in dict.fromkeys(arrivals):  # first arrivals; redelivery is covered above
        if reason is not None:
            late.append(index)
            continue
        add_event(state, events[index], 10)
        reason = closed_reason(state, T0, Limits())
    assert reason == "ended"
    assert late == []
    _, traj = close(state, ALL, reason)
    assert traj is not None and expected is not None
    assert traj.model_dump() == expected.model_dump()
    assert traj.input_messages == start("c").input_messages  # the START's prompt
