"""Span resolution: the OTLP spans of a trace, from any number of exports in any order, become
each agent call's records, keyed by ``call_id``.

A step span (``chat``, ``execute_tool``) belongs to the call of its nearest ancestor that is an
agent span (``invoke_agent``) or names a call (``trajstream.call_id``). An exporter sends spans
as they end, one export at a time or several in parallel (a ``SimpleSpanProcessor``, a Collector
with parallel queues), so a step often arrives before the spans between it and its agent span
(the workflow, chain or task spans frameworks put there), and sometimes after the agent span
itself. No single export can tell; this stage sees the whole trace. The OTLP ingest publishes
every span of an export, with its parent link and the records it maps to
(:class:`~streams.models.TraceFragment`, on ``<p>.spans`` keyed by trace id, so the fragments of
a trace meet on one worker), and :class:`SpanResolver` emits ``AgentCall`` and ``Completion``
records keyed by ``call_id`` for ``<p>.agent-events``, where the assemble stage takes over as for
any other producer.

Rules (``limits`` is a :class:`SpanLimits`):

- a span seen before in the trace (same span id: an exporter's retry, a redelivery) changes
  nothing;
- an agent span: its START is emitted at once, its END held for ``limits.settle`` so that
  children exported after it still join the call (a child later than that is emitted all the
  same; the assemble stage records it as late);
- a step whose chain of ancestors reaches a span that names a call: emitted to that call at
  once, with its steps resolved at the same time in seq order (two on one seq moved apart);
- a step whose chain reaches a root first: an LLM step is a call of its own (START, the step,
  END of one step), a tool step is left out (counted: it trains nothing);
- a step whose chain stops at a span not seen yet is held; ``limits.orphan_after`` after it
  arrived (at least the longest agent run: an agent span is exported when it ends) it is an
  orphan: an LLM step becomes a call of its own, a tool step a late event;
- a trace holding more than ``limits.max_bytes`` of records: the next one is a dead letter;
- once nothing is held, a trace's links are kept ``limits.retention`` after its last span when
  it had GenAI spans (a late child then finds its call and is recorded as late, not as a stray
  call), ``limits.settle`` when it had only plain spans; then the trace is forgotten.

Every record the stage emits has the ``event_id`` the ingest derived from the trace and span
ids, so a record emitted twice (a crash between emitting and storing) counts once downstream.

Store layout (:mod:`streams.state_codec`): ``trace_id`` -> :class:`~streams.models.TraceHead`
(the links of every span, what is held); ``trace_id + 0xFF + span_id`` -> the held record (a step's
:class:`~streams.models.TraceSpan`, an agent's END). Deadlines are kept in memory per partition,
rebuilt from the heads after :meth:`SpanResolver.reset`, as in :mod:`.assemble`.

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from ..codec import SchemaRegistry
from ..envelope import misplaced
from ..errors import RecordError, ValidationError
from ..models import (
    AgentCall,
    Completion,
    HeldSpan,
    SpanLink,
    Tick,
    TraceFragment,
    TraceHead,
    TraceSpan,
)
from ..state_codec import StateCodec, held_key, is_head_key
from .assembly import SEQ_SPACE, Deadlines, step_order, tick_time
from .effects import Envelope, Out, OutputTopic, Reject, Source
from .store import Store

__all__ = ["AGENT_EVENTS", "SpanLimits", "SpanResolver", "call_of"]

AGENT_EVENTS = cast(OutputTopic, "agent_events")
"""The output topic of the stage (:attr:`streams.topics.Topics.agent_events`)."""


@dataclass(frozen=True, slots=True)
class SpanLimits:
    settle: timedelta = timedelta(seconds=5)
    orphan_after: timedelta = timedelta(minutes=10)
    retention: timedelta = timedelta(minutes=15)
    max_bytes: int = 900_000
    max_future: timedelta = timedelta(minutes=5)


class _Root:
    """The chain of parents reached a root (or a cycle) without a span that names a call."""


class _Wait:
    """The chain of parents stops at a span not seen yet."""


ROOT, WAIT = _Root(), _Wait()


def call_of(span_id: str, links: dict[str, SpanLink]) -> str | _Root | _Wait:
    """The call a span belongs to: its own ``call_id`` or that of its nearest ancestor that has
    one (an agent span, or a span with ``trajstream.call_id``); :data:`ROOT` when there is
    none; :data:`WAIT` when an ancestor is missing."""
    node = links[span_id]
    seen = {span_id}
    while True:
        if node.call_id:
            return node.call_id
        if not node.parent_id:
            return ROOT
        parent = links.get(node.parent_id)
        if parent is None:
            return WAIT
        if parent.span_id in seen:  # a cycle: ids are not to be trusted
            return ROOT
        seen.add(parent.span_id)
        node = parent


class SpanResolver:
    """The span-resolution stage over one store; see the module docstring."""

    stage = "spans"

    def __init__(
        self,
        *,
        limits: SpanLimits,
        store: Store,
        codec: SchemaRegistry,
    ) -> None:
        self.limits = limits
        self.store = store
        self.codec = codec  # the dead letters' payloads, as on the wire
        self.stored = StateCodec(codec)
        self._due: dict[int, Deadlines] = {}

    def reset(self) -> None:
        """Forget the deadline index: another worker may have changed the store meanwhile."""
        self._due.clear()

    # -- records -------------------------------------------------------------------------------

    def on_record(self, env: Envelope, now: datetime) -> Out:
        """One record, decoded at the edge: a TraceFragment of ``<p>.spans`` or a Tick of the
        ticks topic (handed to :meth:`on_tick`)."""
        try:
            match env.open():
                case Tick() as tick:
                    return self.on_tick(env.partition, tick_time(tick, now, self.limits.max_future))
                case TraceFragment() as fragment:
                    if env.key != fragment.trace_id.encode():
                        raise ValidationError(
                            f"record key {env.key!r} is not its trace_id {fragment.trace_id!r}: "
                            "key every fragment by trace_id so a trace's spans meet on one "
                            "partition"
                        )
                    return self.on_fragment(fragment, env.partition, now, env.source)
                case other:
                    raise misplaced(other, env.topic)
        except RecordError as exc:
            out = Out()
            out.reject(Reject.of(self.stage, exc, env.source))
            return out

    def on_fragment(
        self, fragment: TraceFragment, partition: int, now: datetime, source: Source | None = None
    ) -> Out:
        """Apply the spans of one fragment (decoded); ``source`` names it in dead letters."""
        out = Out()
        key = fragment.trace_id.encode()
        head = self._load(key) or TraceHead(
            trace_id=fragment.trace_id, partition=partition, first_seen=now, last_seen=now
        )
        links = {link.span_id: link for link in head.links}
        agents: list[TraceSpan] = []
        for span in fragment.spans:
            if span.span_id in links:
                out.stats["spans.duplicate"] += 1
                continue
            out.stats["spans"] += 1
            link = SpanLink(
                span_id=span.span_id, parent_id=span.parent_id, role=span.role, call_id=span.call_id
            )
            links[span.span_id] = link
            head.links.append(link)
            if span.role == "agent":
                if self._start(link, span, out):
                    agents.append(span)
            elif span.role in ("llm", "tool") and span.step is not None:
                self._hold(key, head, link, span, now, out, source)
        self._resolve(key, head, links, now, out)
        for span in agents:  # after the steps they free, so those do not count against ENDs
            self._hold_end(key, head, span, now, out, source)
        head.last_seen = max(head.last_seen, now)
        self._save(key, head, partition)
        return out

    def _start(self, link: SpanLink, span: TraceSpan, out: Out) -> bool:
        """Emit an agent span's START; says whether the span names a call (it always does)."""
        if not link.call_id:
            link.role = "plain"
            return False
        link.emitted = True
        if span.start is not None:
            out.emit(AGENT_EVENTS, link.call_id.encode(), span.start)
        return True

    def _hold_end(
        self,
        key: bytes,
        head: TraceHead,
        span: TraceSpan,
        now: datetime,
        out: Out,
        source: Source | None,
    ) -> None:
        if span.end is None:
            return
        data = self.stored.dump(span.end)
        if self._fits(head, len(data), span, out, source):
            self.store.set(held_key(key, span.span_id), data)
            head.ends.append(
                HeldSpan(span_id=span.span_id, at=now + self.limits.settle, size=len(data))
            )

    def _hold(
        self,
        key: bytes,
        head: TraceHead,
        link: SpanLink,
        span: TraceSpan,
        now: datetime,
        out: Out,
        source: Source | None,
    ) -> None:
        data = self.stored.dump(span)
        if not self._fits(head, len(data), span, out, source):
            link.emitted = True  # left out for good: never resolved
            return
        self.store.set(held_key(key, span.span_id), data)
        head.held.append(HeldSpan(span_id=span.span_id, at=now, size=len(data)))

    def _fits(
        self, head: TraceHead, size: int, span: TraceSpan, out: Out, source: Source | None
    ) -> bool:
        held = sum(h.size for h in head.held) + sum(h.size for h in head.ends)
        if held + size <= self.limits.max_bytes:
            return True
        out.stats["spans.oversized"] += 1
        out.reject(
            Reject(
                self.stage,
                f"span {span.span_id} of trace {head.trace_id}: holding its {size} bytes would "
                f"make the trace's held records larger than {self.limits.max_bytes} bytes "
                "(assembly.max_bytes); left out",
                "Oversized",
                source,
                key=head.trace_id.encode(),
                payload=None if source else self.codec.encode(span),
            )
        )
        return False

    # -- resolving -----------------------------------------------------------------------------

    def _resolve(
        self, key: bytes, head: TraceHead, links: dict[str, SpanLink], now: datetime, out: Out
    ) -> None:
        """Emit the held steps whose call is known now; past the orphan bound, the others too."""
        waiting: list[HeldSpan] = []
        joined: dict[str, list[Completion]] = {}
        for held in head.held:
            where = call_of(held.span_id, links)
            orphan = held.at + self.limits.orphan_after <= now
            if where is WAIT and not orphan:
                waiting.append(held)
                continue
            entry = held_key(key, held.span_id)
            raw = self.store.get(entry)
            self.store.delete(entry)
            links[held.span_id].emitted = True
            if raw is None:  # cannot happen unless the store lost it: nothing to emit
                continue
            span = self.stored.load(raw, TraceSpan)
            assert span.step is not None
            if isinstance(where, str):
                joined.setdefault(where, []).append(span.step.model_copy(update={"call_id": where}))
            elif span.role == "llm":
                out.stats["calls.own" if where is ROOT else "calls.orphan"] += 1
                self._own_call(span, span.step, out)
            elif where is ROOT:
                out.stats["spans.tool_without_call"] += 1
            else:
                out.stats["spans.orphan_tool"] += 1
                missing = _missing(held.span_id, links)
                bound = self.limits.orphan_after.total_seconds()
                out.reject(
                    Reject(
                        "late",
                        f"tool span {held.span_id} of trace {head.trace_id}: its ancestor span "
                        f"{missing} did not arrive within {bound:g}s "
                        "(otlp.orphan_after_s); not part of any call",
                        "Orphan",
                        key=head.trace_id.encode(),
                        payload=self.codec.encode(span.step),
                    )
                )
        head.held = waiting
        for call_id in sorted(joined):
            for step in _separated(step_order(_ties_by_time(joined[call_id]))):
                out.stats["steps.joined"] += 1
                out.emit(AGENT_EVENTS, call_id.encode(), step)

    def _own_call(self, span: TraceSpan, step: Completion, out: Out) -> None:
        """START, step and END of the call of one step an LLM span is outside any agent span."""
        call_id = step.call_id
        if span.start is not None:
            start = span.start
            if not start.input_messages:
                start = start.model_copy(update={"input_messages": step.input_messages})
            out.emit(AGENT_EVENTS, call_id.encode(), start)
        out.emit(AGENT_EVENTS, call_id.encode(), step)
        if span.end is not None:
            out.emit(AGENT_EVENTS, call_id.encode(), span.end)

    # -- the clock -----------------------------------------------------------------------------

    def on_tick(self, partition: int, at: datetime) -> Out:
        """Time passed on ``partition``: emit ENDs that settled, orphans, forget idle traces."""
        out = Out()
        index = self._index(partition)
        for key in index.due(at):
            head = self._load(key)
            if head is None:
                continue
            ends: list[HeldSpan] = []
            links = {link.span_id: link for link in head.links}
            for held in head.ends:
                if held.at > at:
                    ends.append(held)
                    continue
                entry = held_key(key, held.span_id)
                raw = self.store.get(entry)
                self.store.delete(entry)
                if raw is not None:
                    end = self.stored.load(raw, AgentCall)
                    out.stats["calls.ended"] += 1
                    out.emit(AGENT_EVENTS, end.call_id.encode(), end)
            head.ends = ends
            self._resolve(key, head, links, at, out)
            if not head.held and not head.ends and self._expiry(head) <= at:
                out.stats["traces.forgotten"] += 1
                self.store.delete(key)
                continue
            self._save(key, head, head.partition, index)
        return out

    def open_traces(self) -> list[str]:
        """The trace ids the stage holds state for (for replay's report and tests)."""
        return sorted(k.decode() for k, _ in self.store.items() if is_head_key(k))

    def _expiry(self, head: TraceHead) -> datetime:
        genai = any(link.role != "plain" for link in head.links)
        return head.last_seen + (self.limits.retention if genai else self.limits.settle)

    def _next(self, head: TraceHead) -> datetime:
        times = [h.at for h in head.ends]
        times += [h.at + self.limits.orphan_after for h in head.held]
        return min(times) if times else self._expiry(head)

    # -- storage -------------------------------------------------------------------------------

    def _load(self, key: bytes) -> TraceHead | None:
        raw = self.store.get(key)
        return None if raw is None else self.stored.load(raw, TraceHead)

    def _save(
        self, key: bytes, head: TraceHead, partition: int, index: Deadlines | None = None
    ) -> None:
        if head.partition < 0:
            head.partition = partition
        self.store.set(key, self.stored.dump(head))
        (index or self._index(head.partition)).set(key, self._next(head))

    def _index(self, partition: int) -> Deadlines:
        index = self._due.get(partition)
        if index is not None:
            return index
        # one pass over the store builds the index of every partition it holds
        built: dict[int, Deadlines] = {partition: Deadlines()}
        for key, raw in self.store.items():
            if not is_head_key(key):
                continue
            head = self.stored.load(raw, TraceHead)
            if head.partition not in self._due:
                built.setdefault(head.partition, Deadlines()).set(key, self._next(head))
        self._due.update(built)
        return built[partition]


TIE_BITS = 4
"""The low bits of a span's seq that are not its start millisecond (the ingest's
:func:`streams.capture.otlp.seq_of`: start ms times 16 plus 4 bits of the span id)."""


def _ties_by_time(steps: list[Completion]) -> list[Completion]:
    """Steps that started in one millisecond get their tie bits in the order they ended.

    The ingest fills the tie bits from the span id (random), which is no order: a tool span and
    the chat span right after it, started in one millisecond, would come out in either order.
    Resolved together, their end times order them (a step ends before the next one starts)."""
    groups: dict[int, list[Completion]] = {}
    for step in steps:
        groups.setdefault(step.seq >> TIE_BITS, []).append(step)
    out: list[Completion] = []
    for millis, group in groups.items():
        if len(group) == 1 or len(group) > 1 << TIE_BITS:
            out.extend(group)
            continue
        group.sort(key=lambda s: (s.event_time, s.seq))
        for tie, step in enumerate(group):
            seq = (millis << TIE_BITS) | tie
            out.append(step if seq == step.seq else step.model_copy(update={"seq": seq}))
    return out


def _separated(steps: list[Completion]) -> list[Completion]:
    """Steps of one call in seq order, two on one seq moved apart (the later one seq + 1)."""
    out: list[Completion] = []
    taken: set[int] = set()
    for step in steps:
        seq = step.seq
        while seq in taken:
            seq = (seq + 1) % SEQ_SPACE
        taken.add(seq)
        out.append(step if seq == step.seq else step.model_copy(update={"seq": seq}))
    return out


def _missing(span_id: str, links: dict[str, SpanLink]) -> str:
    """The first ancestor of ``span_id`` that was never seen."""
    node, seen = links[span_id], {span_id}
    while node.parent_id in links and node.parent_id not in seen:
        seen.add(node.parent_id)
        node = links[node.parent_id]
    return node.parent_id or "?"
