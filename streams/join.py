"""Trajectory assembly: joining a call's events into one trajectory.

All events of a call (its START, its steps, its END) are keyed by ``call_id`` on the
agent-events topic, so one worker sees all of them, in the order of their partition. The state
of an open call is a :class:`~streams.models.PendingCall`; these functions move it forward and
decide when it closes. They are pure: the Faust agent stores the state in a changelog-backed
table and deletes it (a tombstone) when the call closes.

Rules:
- an event whose ``event_id`` was already applied is a duplicate and changes nothing;
- steps are ordered by ``seq``, not by arrival; two steps with one ``seq`` keep the first;
- a call is complete at its END once it holds ``step_count`` steps (when the END says how many);
- a call that stays open longer than the abandon timeout is closed as ``abandoned``;
- a call that exceeds the step or byte limit is closed at once as ``oversized``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from .models import (
    AgentCall,
    CallPhase,
    Completion,
    PendingCall,
    Selection,
    StepKind,
    Trajectory,
)
from .select import CallView, Strategy

__all__ = [
    "Applied",
    "Limits",
    "add_event",
    "close",
    "closed_reason",
    "new_pending",
    "task_id_for",
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


def new_pending(call_id: str, now: datetime) -> PendingCall:
    return PendingCall(call_id=call_id, first_seen=now)


def _seen_ids(state: PendingCall) -> set[str]:
    ids = {s.event_id for s in state.steps}
    if state.start:
        ids.add(state.start.event_id)
    if state.end:
        ids.add(state.end.event_id)
    return ids


def add_event(state: PendingCall, event: AgentCall | Completion, size: int) -> Applied:
    """Apply one event (of ``size`` bytes on the wire) to the open call, in place."""
    if event.event_id in _seen_ids(state):
        return Applied.DUPLICATE
    if isinstance(event, Completion):
        if any(s.seq == event.seq for s in state.steps):
            return Applied.DUPLICATE_SEQ
        state.steps.append(event)
        state.steps.sort(key=lambda s: s.seq)
    elif event.phase is CallPhase.START:
        if state.start is not None:
            return Applied.DUPLICATE
        state.start = event
    else:
        if state.end is not None:
            return Applied.DUPLICATE
        state.end = event
    state.bytes += size
    return Applied.ADDED


def closed_reason(state: PendingCall, now: datetime, limits: Limits) -> str | None:
    """Why the call should close now, or None while it stays open."""
    if len(state.steps) > limits.max_steps:
        return f"oversized: more than {limits.max_steps} steps"
    if state.bytes > limits.max_bytes:
        return f"oversized: more than {limits.max_bytes} bytes"
    if state.end is not None:
        expected = state.end.step_count
        if expected is None or len(state.steps) >= expected:
            return "ended"
    if now - state.first_seen > limits.abandon_after:
        return "abandoned: no end event" if state.end is None else (
            f"abandoned: {len(state.steps)} of {state.end.step_count} steps arrived"
        )
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


def _last_model(steps: list[Completion]) -> str | None:
    for step in reversed(steps):
        if step.kind is StepKind.LLM and (step.response_model or step.request_model):
            return step.response_model or step.request_model
    return None


def close(state: PendingCall, strategy: Strategy, reason: str) -> tuple[Selection, Trajectory | None]:
    """Decide selection for a closing call and build its trajectory when selected.

    A call without an END (abandoned, or oversized before its end) is never selected here:
    it is returned with the selection reason ``abandoned`` / ``oversized`` for the records.
    """
    if state.end is None:
        why = reason.split(":", 1)[0]
        return Selection(selected=False, strategy=strategy.name, reason=why), None
    view = CallView(state.call_id, state.start, state.end, _last_model(state.steps))
    selection = strategy.decide(view)
    if not selection.selected:
        return selection, None
    start, end = state.start, state.end
    mark = view.mark
    trajectory = Trajectory(
        trajectory_id=state.call_id,
        call_id=state.call_id,
        task_id=task_id_for(view),
        run_id=(mark.run_id or 0) if mark else 0,
        agent_id=end.agent_id or (start.agent_id if start else None),
        agent_name=view.agent_name,
        agent_version=end.agent_version or (start.agent_version if start else None),
        conversation_id=end.conversation_id or (start.conversation_id if start else None),
        input_messages=start.input_messages if start else end.input_messages,
        output=end.output,
        status=end.status,
        error_type=end.error_type,
        steps=list(state.steps),
        mark=mark,
        selection=selection,
        started_at=start.event_time if start else None,
        ended_at=end.event_time,
        closed_reason=reason,
    )
    return selection, trajectory
