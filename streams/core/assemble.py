"""Stage 1, assemble: a call's events -> a selection decision and, if selected, a trajectory.

:class:`Assembler` is the stage as a step function over two stores: ``pending`` (open calls,
stored append-only by :class:`~streams.core.pending.PendingCodec`) and ``closed`` (a small
marker per closed call, kept ``late_retention`` so that a late event is recorded, never applied
twice and never dropped). The rules of assembly are in :mod:`streams.core.assembly`; this
module applies them to records and to the clock:

- :meth:`Assembler.on_record`: one record of ``<p>.agent-events`` (an AgentCall or a
  Completion, nothing else) or a Tick of ``<p>.ticks``, handed to :meth:`on_tick`: only that
  topic moves the clock, so no input record can; a tick or an event dated more than
  ``limits.max_future`` ahead of the clock is a dead letter;
- :meth:`Assembler.on_tick`: time passed on a partition: abandon calls open too long, forget
  closed calls past their retention.

Deadlines are kept in memory beside the stores, per partition, rebuilt from the store after
:meth:`reset` (the live runner calls it on every partition assignment).

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..codec import SchemaRegistry
from ..errors import RecordError, ValidationError
from ..models import (
    AgentCall,
    ClosedCall,
    Completion,
    PendingCall,
    SelectionDecision,
)
from .assembly import (
    Applied,
    Deadlines,
    Limits,
    Progress,
    check_not_future,
    close,
    closed_reason,
    tick_time,
    view_of,
)
from .effects import Out, Reject, Source
from .pending import PendingCodec
from .select import Strategy
from .store import Store

__all__ = ["Assembler", "check_key"]


def check_key(src: Source, call_id: str) -> bytes:
    """The record's key, which must be its call_id (so a call's records meet on one partition)."""
    key = src.key
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
        ticks_topic: str = "ticks",
    ) -> None:
        self.ticks_topic = ticks_topic
        self.strategy = strategy
        self.limits = limits
        self.late_retention = late_retention
        self.pending = pending
        self.closed = closed
        self.codec = codec
        self.pending_codec = PendingCodec(codec)
        self._abandon: dict[int, Deadlines] = {}
        self._forget: dict[int, Deadlines] = {}

    def reset(self) -> None:
        """Forget the deadline indexes: another worker may have changed the stores meanwhile."""
        self._abandon.clear()
        self._forget.clear()

    # -- records -------------------------------------------------------------------------------

    def on_record(self, src: Source, now: datetime) -> Out:
        out = Out()
        try:
            record = self.codec.decode(src.value)
            at = tick_time(record, src.topic, self.ticks_topic, now, self.limits.max_future)
            if at is not None:
                return self.on_tick(src.partition, at)
            if not isinstance(record, AgentCall | Completion):
                raise RecordError(f"{record.avro_name} does not belong on {src.topic}")
            check_not_future("event_time", record.event_time, now, self.limits.max_future)
            self._event(src, record, now, out)
        except RecordError as exc:
            out.reject(Reject(self.stage, str(exc) or type(exc).__name__, type(exc).__name__, src))
        return out

    def _event(self, src: Source, record: AgentCall | Completion, now: datetime, out: Out) -> None:
        key = check_key(src, record.call_id)
        closed = self.closed.get(key)
        if closed is not None:
            out.stats["events.late"] += 1
            out.reject(self._late(src, self.codec.decode_as(closed, ClosedCall)))
            return
        stored = self.pending.get(key)
        if stored is not None:
            progress = self.pending_codec.progress(stored)
        else:
            progress = Progress(record.call_id, now, src.partition)
        applied = progress.apply(record, len(src.value))
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
                    f"an event of {len(src.value)} bytes would make call {record.call_id} larger "
                    f"than assembly.max_bytes ({self.limits.max_bytes}); "
                    + (
                        "the call closed as oversized with what it had"
                        if stored is not None
                        else "nothing of the call was kept"
                    ),
                    "Oversized",
                    src,
                )
            )
            if stored is not None:
                reason = f"oversized: more than {self.limits.max_bytes} bytes"
                self._close(key, self.pending_codec.pending_call(stored), reason, now, out)
            return
        out.stats["events.applied"] += 1
        item = PendingCodec.item(record, src.value)
        if stored is None:
            stored = self.pending_codec.new(record.call_id, src.partition, now, item)
            self._index(self._abandon, src.partition).set(key, now + self.limits.abandon_after)
        else:
            stored = self.pending_codec.append(stored, item)
        reason = closed_reason(progress, now, self.limits)
        if reason is None:
            self.pending.set(key, stored)
        else:
            self._close(key, self.pending_codec.pending_call(stored), reason, now, out)

    @staticmethod
    def _late(src: Source, closed: ClosedCall) -> Reject:
        reason = (
            f"arrived after call {closed.call_id} closed at {closed.closed_at.isoformat()} "
            f"({closed.reason}); late, or redelivered after a restart"
        )
        return Reject("late", reason, "Late", src)

    # -- closing -------------------------------------------------------------------------------

    def _close(self, key: bytes, state: PendingCall, reason: str, now: datetime, out: Out) -> None:
        selection, trajectory = close(state, self.strategy, reason)
        self.pending.delete(key)
        self._index(self._abandon, state.partition).discard(key)
        self.closed.set(
            key,
            self.codec.encode(
                ClosedCall(
                    call_id=state.call_id, partition=state.partition, closed_at=now, reason=reason
                )
            ),
        )
        self._index(self._forget, state.partition).set(key, now + self.late_retention)
        out.stats[f"calls.{'selected' if selection.selected else 'rejected'}"] += 1
        view = view_of(state)
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

    def on_tick(self, partition: int, at: datetime) -> Out:
        """Time passed on ``partition``: close calls open too long, forget old closed calls."""
        out = Out()
        index = self._index(self._abandon, partition)
        for key in index.due(at):
            raw = self.pending.get(key)
            if raw is None:
                continue
            reason = closed_reason(self.pending_codec.progress(raw), at, self.limits)
            if reason is None:  # due exactly now: closed_reason wants strictly later
                index.set(key, at + timedelta(milliseconds=1))
            else:
                self._close(key, self.pending_codec.pending_call(raw), reason, at, out)
        for key in self._index(self._forget, partition).due(at):
            self.closed.delete(key)
        return out

    def open_calls(self) -> list[str]:
        """The call ids still open (for replay's report of incomplete calls)."""
        return sorted(self.pending_codec.progress(raw).call_id for _, raw in self.pending.items())

    def _index(self, indexes: dict[int, Deadlines], partition: int) -> Deadlines:
        index = indexes.get(partition)
        if index is None:
            index = indexes[partition] = Deadlines()
            if indexes is self._abandon:
                for key, raw in self.pending.items():
                    progress = self.pending_codec.progress(raw)
                    if progress.partition == partition:
                        index.set(key, progress.first_seen + self.limits.abandon_after)
            else:
                for key, raw in self.closed.items():
                    closed = self.codec.decode_as(raw, ClosedCall)
                    if closed.partition == partition:
                        index.set(key, closed.closed_at + self.late_retention)
        return index
