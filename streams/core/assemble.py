"""Stage 1, assemble: a call's events -> a selection decision and, if selected, a trajectory.

:class:`Assembler` is the stage as a step function over two stores: ``pending`` (open calls,
one store entry per event, by :class:`~streams.core.pending.OpenCalls`) and ``closed`` (a small
marker per closed call, kept ``late_retention`` so that a late event is recorded, never applied
twice and never dropped). The rules of assembly are in :mod:`streams.core.assembly`; this
module applies them to records and to the clock:

- :meth:`Assembler.on_record`: one record, decoded at the edge (:mod:`streams.envelope`, which
  lets only AgentCall and Completion records through ``<p>.agent-events`` and only ticks through
  ``<p>.ticks``): an event is applied, a Tick handed to :meth:`on_tick` (so no input record can
  move the clock); a tick or an event dated more than ``limits.max_future`` ahead of the clock
  is a dead letter;
- :meth:`Assembler.on_tick`: time passed on a partition: abandon calls open too long, forget
  closed calls past their retention.

Deadlines are kept in memory beside the stores, per partition, rebuilt from the store after
:meth:`reset` (the live runner calls it on every partition assignment), as is the cache of
open calls (:class:`~streams.core.pending.OpenCalls`).

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..codec import SchemaRegistry
from ..envelope import misplaced
from ..errors import RecordError, ValidationError
from ..models import (
    AgentCall,
    CallPhase,
    ClosedCall,
    Completion,
    PendingCall,
    SelectionDecision,
    Tick,
)
from ..state_codec import StateCodec, is_head_key
from .assembly import (
    Applied,
    Deadlines,
    Limits,
    Progress,
    check_not_future,
    close,
    closed_reason,
    step_order,
    tick_time,
    view_of,
)
from .effects import Envelope, Out, Reject, Source
from .pending import OpenCall, OpenCalls
from .select import Strategy
from .store import Store

__all__ = ["Assembler", "check_key"]


def check_key(env: Envelope, call_id: str) -> bytes:
    """The record's key, which must be its call_id (so a call's records meet on one partition)."""
    key = env.key
    if key is None or key != call_id.encode():
        raise ValidationError(
            f"record key {key!r} is not its call_id {call_id!r}: key every event by call_id "
            "so a call's events meet on one partition"
        )
    return bytes(key)


class Assembler:
    """The assemble stage over ``pending`` and ``closed`` stores; see the module docstring."""

    stage = "assemble"

    def __init__(
        self,
        strategy: Strategy,
        *,
        limits: Limits,
        late_retention: timedelta,
        pending: Store,
        closed: Store,
        codec: SchemaRegistry,
        state: StateCodec | None = None,
    ) -> None:
        self.strategy = strategy
        self.limits = limits
        self.late_retention = late_retention
        self.closed = closed
        self.codec = codec
        self.stored = state or StateCodec(codec)
        self.open = OpenCalls(pending, codec, state=self.stored)
        self._abandon: dict[int, Deadlines] = {}
        self._forget: dict[int, Deadlines] = {}

    @property
    def pending(self) -> Store:
        """The store of open calls (one entry per event; see :mod:`streams.core.pending`)."""
        return self.open.store

    @pending.setter
    def pending(self, store: Store) -> None:
        self.open.store = store
        self.reset()

    def reset(self) -> None:
        """Forget the deadline indexes: another worker may have changed the stores meanwhile."""
        self._abandon.clear()
        self._forget.clear()
        self.open.reset()

    # -- records -------------------------------------------------------------------------------

    def on_record(self, env: Envelope, now: datetime) -> Out:
        """One record of ``<p>.agent-events`` (an AgentCall or a Completion) or a Tick of
        ``<p>.ticks`` (handed to :meth:`on_tick`), decoded at the edge."""
        out = Out()
        try:
            match env.open():
                case Tick() as tick:
                    return self.on_tick(env.partition, tick_time(tick, now, self.limits.max_future))
                case AgentCall() | Completion() as event:
                    check_not_future("event_time", event.event_time, now, self.limits.max_future)
                    self._event(env, event, now, out)
                case other:
                    raise misplaced(other, env.topic)
        except RecordError as exc:
            out.reject(Reject.of(self.stage, exc, env.source))
        return out

    def _event(
        self, env: Envelope, record: AgentCall | Completion, now: datetime, out: Out
    ) -> None:
        key = check_key(env, record.call_id)
        closed = self.closed.get(key)
        if closed is not None:
            out.stats["events.late"] += 1
            out.reject(self._late(env.source, self.stored.load(closed, ClosedCall)))
            return
        try:
            self._apply(key, env, record, now, out)
        except BaseException:
            # the cached progress may count an event the store never got: the store decides
            self.open.discard(key)
            raise

    def _apply(
        self, key: bytes, env: Envelope, record: AgentCall | Completion, now: datetime, out: Out
    ) -> None:
        data = env.value  # the event as read: stored as it is, and counted by its size
        call = self.open.get(key)
        if call is not None:
            progress = call.progress
        else:
            progress = Progress(record.call_id, now, env.partition)
        applied = progress.apply(record, len(data))
        if applied is Applied.DUPLICATE:
            out.stats["events.duplicate"] += 1
            return
        if applied is Applied.DUPLICATE_SEQ:
            assert isinstance(record, Completion)
            raise ValidationError(
                f"step seq {record.seq} of call {record.call_id} arrived twice with different "
                "event ids; the first was kept"
            )
        if progress.bytes > self.limits.max_bytes:
            # the stored call, and its trajectory, must stay one record: this event is not
            # added, and the call closes as oversized with what it had
            out.stats["events.oversized"] += 1
            out.reject(
                Reject(
                    self.stage,
                    f"an event of {len(data)} bytes would make call {record.call_id} larger "
                    f"than assembly.max_bytes ({self.limits.max_bytes}); "
                    + (
                        "the call closed as oversized with what it had"
                        if call is not None
                        else "nothing of the call was kept"
                    ),
                    "Oversized",
                    env.source,
                )
            )
            if call is not None:
                state = self.open.pending_call(key, call)
                state.bytes -= len(data)  # progress counted the event not added
                reason = f"oversized: more than {self.limits.max_bytes} bytes"
                self._close(key, call, state, reason, now, out)
            return
        out.stats["events.applied"] += 1
        reason = closed_reason(progress, now, self.limits)
        if call is None:
            self._index(self._abandon, env.partition).set(key, now + self.limits.abandon_after)
        if reason is None:
            self.open.add(key, call, progress, record, data)
        else:
            # the closing event is not stored: the call's entries are deleted now
            state = self.open.pending_call(key, call) if call is not None else None
            state = _with_event(state, progress, record)
            self._close(key, call, state, reason, now, out)

    @staticmethod
    def _late(src: Source | None, closed: ClosedCall) -> Reject:
        reason = (
            f"arrived after call {closed.call_id} closed at {closed.closed_at.isoformat()} "
            f"({closed.reason}); late, or redelivered after a restart"
        )
        return Reject("late", reason, "Late", src)

    # -- closing -------------------------------------------------------------------------------

    def _close(
        self,
        key: bytes,
        call: OpenCall | None,
        state: PendingCall,
        reason: str,
        now: datetime,
        out: Out,
    ) -> None:
        view = view_of(state)
        selection, trajectory = close(state, self.strategy, reason, view)
        if call is not None:
            self.open.delete(key, call)
        self._index(self._abandon, state.partition).discard(key)
        self.closed.set(
            key,
            self.stored.dump(
                ClosedCall(
                    call_id=state.call_id, partition=state.partition, closed_at=now, reason=reason
                )
            ),
        )
        self._index(self._forget, state.partition).set(key, now + self.late_retention)
        out.stats[f"calls.{'selected' if selection.selected else 'rejected'}"] += 1
        decision = SelectionDecision(
            call_id=state.call_id,
            agent_name=view.agent_name,
            model=view.model,
            selection=selection,
            closed_reason=reason,
            steps=len(state.steps),
            marked=view.mark is not None,
            ended_at=state.end.event_time if state.end else None,
            decided_at=now,
        )
        out.emit("decisions", key, decision)
        if trajectory is not None:
            out.emit("trajectories", key, trajectory, partition=state.partition)

    # -- the clock -----------------------------------------------------------------------------

    def wakes(self, partition: int, at: datetime) -> bool:
        """Whether :meth:`on_tick` at ``at`` has anything to do on ``partition`` (replay, which
        ticks at every record, asks first)."""
        return self._index(self._abandon, partition).any_due(at) or self._index(
            self._forget, partition
        ).any_due(at)

    def on_tick(self, partition: int, at: datetime) -> Out:
        """Time passed on ``partition``: close calls open too long, forget old closed calls."""
        out = Out()
        index = self._index(self._abandon, partition)
        for key in index.due(at):
            call = self.open.get(key)
            if call is None:
                continue
            reason = closed_reason(call.progress, at, self.limits)
            if reason is None:  # due exactly now: closed_reason wants strictly later
                index.set(key, at + timedelta(milliseconds=1))
            else:
                self._close(key, call, self.open.pending_call(key, call), reason, at, out)
        for key in self._index(self._forget, partition).due(at):
            self.closed.delete(key)
        return out

    def open_calls(self) -> list[str]:
        """The call ids still open (for replay's report of incomplete calls)."""
        return sorted(self.open.call_ids())

    def _index(self, indexes: dict[int, Deadlines], partition: int) -> Deadlines:
        index = indexes.get(partition)
        if index is not None:
            return index
        # One pass over the store builds the index of every partition it holds (the store is
        # one table for all of this worker's partitions): after a reset, the first record of
        # each partition would otherwise scan the whole table again.
        built: dict[int, Deadlines] = {partition: Deadlines()}
        if indexes is self._abandon:
            for key, raw in self.pending.items():
                if is_head_key(key):
                    _, owner, first_seen = self.open.head(raw)
                    if owner not in indexes:
                        built.setdefault(owner, Deadlines()).set(
                            key, first_seen + self.limits.abandon_after
                        )
        else:
            for key, raw in self.closed.items():
                closed = self.stored.load(raw, ClosedCall)
                if closed.partition not in indexes:
                    built.setdefault(closed.partition, Deadlines()).set(
                        key, closed.closed_at + self.late_retention
                    )
        indexes.update(built)
        return built[partition]


def _with_event(
    state: PendingCall | None, progress: Progress, event: AgentCall | Completion
) -> PendingCall:
    """The call's working view with the event that closes it (``progress`` counts it)."""
    if state is None:
        state = PendingCall(
            call_id=progress.call_id, first_seen=progress.first_seen, partition=progress.partition
        )
    if isinstance(event, Completion):
        state.steps = step_order([*state.steps, event])
    elif event.phase is CallPhase.START:
        state.start = event
    else:
        state.end = event
    state.bytes = progress.bytes
    return state
