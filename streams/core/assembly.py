"""Trajectory assembly: joining a call's events into one trajectory.

All events of a call (its START, its steps, its END) are keyed by ``call_id`` on the
agent-events topic, so one worker sees all of them, in the order of their partition. The state
of an open call is a :class:`~streams.models.PendingCall`; these functions move it forward and
decide when it closes. They are pure: the Faust agent stores the state in a changelog-backed
table and deletes it (a tombstone) when the call closes.

Rules:
- an event whose ``event_id`` was already applied is a duplicate and changes nothing;
- steps are ordered by ``seq``, not by arrival; two steps with one ``seq`` keep the first;
- ``seq`` is read as a counter modulo 2**31 that may wrap: the order starts after the largest gap
  between a call's seqs (:func:`step_order`). Producers that count 0, 1, 2... see plain numeric
  order; a producer that derives ``seq`` from time without shared state (the OTLP ingest) may
  cross the wrap inside a call and keep its order;
- a call is complete when it holds its START, its END and the ``step_count`` steps the END
  counts (any steps, when the END does not count them), whatever the order they arrived in: a
  START that arrives last is joined, not late;
- a call whose END counts fewer steps than arrived closes at once as ``inconsistent`` (with the
  counts in the reason): the trajectory keeps every step, and, like any call not ``ended``, the
  reward stage does not score it unless told to (``reward.score_incomplete``);
- a call that stays open longer than the abandon timeout is closed as ``abandoned``;
- a call that exceeds the step or byte limit is closed at once as ``oversized``.

May import: the standard library, :mod:`streams.models`, the core.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from ..errors import ValidationError
from ..models import (
    AgentCall,
    CallPhase,
    Completion,
    PendingCall,
    Selection,
    StepKind,
    Tick,
    Trajectory,
)
from .arms import call_arm, policy_version_of, scored_unselected
from .select import CallView, Strategy, routed_selection

__all__ = [
    "SEQ_SPACE",
    "Applied",
    "Deadlines",
    "Limits",
    "Progress",
    "add_event",
    "close",
    "closed_reason",
    "last_model",
    "new_pending",
    "progress_of",
    "step_order",
    "task_id_for",
    "view_of",
]


class Applied(StrEnum):
    ADDED = "added"
    DUPLICATE = "duplicate"
    DUPLICATE_SEQ = "duplicate-seq"


@dataclass(frozen=True, slots=True)
class Limits:
    max_steps: int = 256
    max_bytes: int = 1_000_000
    abandon_after: timedelta = timedelta(minutes=10)
    max_future: timedelta = timedelta(minutes=5)
    """How far ahead of the clock a record may be dated (agents' clocks drift a little)."""


def check_not_future(what: str, at: datetime, now: datetime, max_future: timedelta) -> None:
    """A record dated more than ``max_future`` after ``now`` is invalid: it would move a clock
    (the ledger's watermark, a mark's age, a tick's deadlines) into the future."""
    if at > now + max_future:
        raise ValidationError(
            f"{what} {at.isoformat()} is more than {max_future.total_seconds():g}s ahead of "
            f"the clock ({now.isoformat()}); not applied (assembly.max_future_s)"
        )


def tick_time(tick: Tick, now: datetime, max_future: timedelta) -> datetime:
    """The time a tick sets a stage's clock to (ticks come only from the ticks topic, which
    :mod:`streams.envelope` checks); a tick dated past ``max_future`` is a
    :class:`~streams.errors.RecordError`."""
    check_not_future("tick", tick.at, now, max_future)
    return tick.at


def new_pending(call_id: str, now: datetime) -> PendingCall:
    return PendingCall(call_id=call_id, first_seen=now)


@dataclass(slots=True)
class Progress:
    """What the assembly needs to know of an open call to apply an event and to decide when it
    closes, without the events themselves: ids seen, steps seen, start/end, sizes."""

    call_id: str
    first_seen: datetime
    partition: int = -1
    ids: set[str] = field(default_factory=set)
    seqs: set[int] = field(default_factory=set)
    has_start: bool = False
    has_end: bool = False
    expected_steps: int | None = None
    bytes: int = 0

    def apply(self, event: AgentCall | Completion, size: int) -> Applied:
        """Record one event (of ``size`` bytes on the wire); says whether it was new."""
        if event.event_id in self.ids:
            return Applied.DUPLICATE
        if isinstance(event, Completion):
            if event.seq in self.seqs:
                return Applied.DUPLICATE_SEQ
            self.seqs.add(event.seq)
        elif event.phase is CallPhase.START:
            if self.has_start:
                return Applied.DUPLICATE
            self.has_start = True
        else:
            if self.has_end:
                return Applied.DUPLICATE
            self.has_end = True
            self.expected_steps = event.step_count
        self.ids.add(event.event_id)
        self.bytes += size
        return Applied.ADDED


def progress_of(state: PendingCall) -> Progress:
    progress = Progress(state.call_id, state.first_seen, state.partition)
    progress.ids = {s.event_id for s in state.steps}
    progress.seqs = {s.seq for s in state.steps}
    for event in (state.start, state.end):
        if event is not None:
            progress.ids.add(event.event_id)
    progress.has_start = state.start is not None
    progress.has_end = state.end is not None
    progress.expected_steps = state.end.step_count if state.end else None
    progress.bytes = state.bytes
    return progress


def add_event(state: PendingCall, event: AgentCall | Completion, size: int) -> Applied:
    """Apply one event (of ``size`` bytes on the wire) to the open call, in place."""
    applied = progress_of(state).apply(event, size)
    if applied is not Applied.ADDED:
        return applied
    if isinstance(event, Completion):
        state.steps.append(event)
        state.steps[:] = step_order(state.steps)
    elif event.phase is CallPhase.START:
        state.start = event
    else:
        state.end = event
    state.bytes += size
    return Applied.ADDED


SEQ_SPACE = 2**31
"""``seq`` is an Avro int that is never negative: values 0 .. 2**31 - 1."""


def step_order(steps: list[Completion]) -> list[Completion]:
    """The steps in ``seq`` order, reading ``seq`` as a wrapping counter modulo 2**31.

    The order starts at the seq after the largest gap between neighbouring seqs (the gap from
    the largest back round to the smallest included). For seqs 0..n-1 that gap is the wrap
    itself, so the order is the numeric one; for time-derived seqs that crossed 2**31 inside a
    call (a call spans far less than half the space), the seqs after the wrap come last.
    """
    ordered = sorted(steps, key=lambda s: s.seq)
    if len(ordered) < 2:
        return ordered
    best, origin = ordered[0].seq + SEQ_SPACE - ordered[-1].seq, 0
    for i in range(1, len(ordered)):
        gap = ordered[i].seq - ordered[i - 1].seq
        if gap > best:
            best, origin = gap, i
    return ordered[origin:] + ordered[:origin]


def closed_reason(state: PendingCall | Progress, now: datetime, limits: Limits) -> str | None:
    """Why the call should close now, or None while it stays open."""
    progress = state if isinstance(state, Progress) else progress_of(state)
    steps = len(progress.seqs)
    if steps > limits.max_steps:
        return f"oversized: more than {limits.max_steps} steps"
    if progress.bytes > limits.max_bytes:
        return f"oversized: more than {limits.max_bytes} bytes"
    expected = progress.expected_steps
    if progress.has_end and progress.has_start:
        if expected is not None and steps > expected:
            return f"inconsistent: {steps} steps arrived, the end event counts {expected}"
        if expected is None or steps == expected:
            return "ended"
    if now - progress.first_seen > limits.abandon_after:
        if not progress.has_end:
            return "abandoned: no end event"
        if not progress.has_start:
            return "abandoned: no start event"
        return f"abandoned: {steps} of {expected} steps arrived"
    return None


def task_id_for(call: CallView) -> str:
    """Trinity's task_id: the mark's, else ``task-<call_id>`` (hashed when too long for 64)."""
    mark = call.mark
    if mark is not None and mark.task_id:
        return mark.task_id
    candidate = f"task-{call.call_id}"
    if len(candidate) <= 64:
        return candidate
    return "task-" + hashlib.sha256(call.call_id.encode()).hexdigest()[:40]


class Deadlines:
    """Keys with a deadline; :meth:`due` hands out the keys whose deadline has passed.

    An in-memory index beside a table, so that a clock tick costs the number of keys that are
    due, not the size of the table. Setting a key again replaces its deadline.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, bytes]] = []
        self._at: dict[bytes, datetime] = {}

    def set(self, key: bytes, at: datetime) -> None:
        self._at[key] = at
        heapq.heappush(self._heap, (at, key))

    def discard(self, key: bytes) -> None:
        self._at.pop(key, None)

    def any_due(self, now: datetime) -> bool:
        """Whether :meth:`due` may hand out a key at ``now`` (cheap: the earliest deadline)."""
        return bool(self._heap) and self._heap[0][0] <= now

    def due(self, now: datetime) -> list[bytes]:
        out = []
        while self._heap and self._heap[0][0] <= now:
            at, key = heapq.heappop(self._heap)
            if self._at.get(key) == at:
                del self._at[key]
                out.append(key)
        if len(self._heap) > 2 * len(self._at) + 64:  # drop replaced entries now and then
            self._heap = [(a, k) for k, a in self._at.items()]
            heapq.heapify(self._heap)
        return out

    def __len__(self) -> int:
        return len(self._at)


def last_model(steps: list[Completion]) -> str | None:
    """The model of the last LLM step (response model, else requested model)."""
    for step in reversed(steps):
        if step.kind is StepKind.LLM and (step.response_model or step.request_model):
            return step.response_model or step.request_model
    return None


def view_of(state: PendingCall) -> CallView:
    last = max((s.event_time for s in state.steps), default=None)
    return CallView(state.call_id, state.start, state.end, last_model(state.steps), last)


def close(
    state: PendingCall, strategy: Strategy, reason: str, view: CallView | None = None
) -> tuple[Selection, Trajectory | None]:
    """Decide selection for a closing call and build its trajectory when selected, or when a
    gateway routed it to production (scored for the comparison, not trained on:
    :mod:`streams.core.arms`). The trajectory's ``upstream`` is the call's arm
    (:func:`~.arms.call_arm`: a call routed to the policy that fell back is
    ``trinity-fallback`` or ``mixed``) and its ``policy_version`` the oldest of its steps'.

    A call a gateway routed is selected as its START says (:func:`~.select.routed_selection`);
    the others by ``strategy``.

    A call closed without its END (abandoned, or oversized before its end) is decided like any
    other and, when selected, keeps what it had; its ``closed_reason`` says why it closed, and
    the reward stage does not score it unless told to. ``view``: :func:`view_of` the state, if
    the caller has it already.
    """
    view = view or view_of(state)
    # a routed call keeps the gateway's decision; any other is decided now. A routed call
    # that is not selected (production answered it) is still scored, for the comparison
    selection = routed_selection(state.start) or strategy.decide(view)
    if not selection.selected and not scored_unselected(state.start):
        return selection, None
    start, end = state.start, state.end
    first = start or end
    mark = view.mark
    trajectory = Trajectory(
        trajectory_id=state.call_id,
        call_id=state.call_id,
        task_id=task_id_for(view),
        run_id=(mark.run_id or 0) if mark else 0,
        agent_id=_first(e.agent_id for e in (end, start) if e),
        agent_name=view.agent_name,
        agent_version=_first(e.agent_version for e in (end, start) if e),
        conversation_id=_first(e.conversation_id for e in (end, start) if e),
        input_messages=first.input_messages if first else [],
        output=end.output if end else None,
        status=end.status if end else None,
        error_type=end.error_type if end else None,
        steps=list(state.steps),
        mark=mark,
        selection=selection,
        started_at=start.event_time if start else None,
        ended_at=view.ended_at,
        closed_reason=reason,
        upstream=call_arm(start, state.steps),
        policy_version=policy_version_of(state.steps),
    )
    return selection, trajectory


def _first(values: Iterable[str | None]) -> str | None:
    return next((v for v in values if v), None)
