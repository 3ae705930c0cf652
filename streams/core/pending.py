"""The stored form of open calls: one store entry per event, so the changelog grows linearly.

An open call is kept in the assembly's ``pending`` store as one
:class:`~streams.models.OpenCallEvent` entry per applied event: the first under the call's key
(``call_id``), carrying the call's ``call_id``, ``partition`` and ``first_seen``; the n-th
(n = 1, 2, ...) under ``call_id + 0xFF + n`` (the byte layout, keys and values, is
:mod:`streams.state_codec`'s). Each event is one store write of about its own size (one changelog
record in the live worker, instead of a rewrite of the whole growing call), and closing the call
deletes its entries. A call's entries are found by counting up from its key until one is
missing: no range read or scan, which a Faust table (a dict restored from its changelog) has
not.

Each entry carries the event's id, kind, seq, the END's step count and size beside its bytes,
so the assembly's :class:`~streams.core.assembly.Progress` is rebuilt without decoding events.

:class:`OpenCalls` adds a bounded in-process cache beside the store: the progress of recently
touched calls (up to ``cache_calls``) and, for the most recent of them, the events already
decoded when they arrived (up to ``cache_bytes`` of their wire bytes), so that neither is read
again from the store and a closing call's events are not decoded a second time. A call whose
decoded events were dropped keeps its progress and decodes its events at close. The store stays the
truth: a miss (a call evicted, or any call after :meth:`OpenCalls.reset`, which the runners call
when partitions move) reads it back, and every change is written to the store first.

The stored form of older versions, one :class:`~streams.models.PendingEvents` value per call
under its key, is still read; such a call is rewritten as entries when its next event arrives.

May import: :mod:`streams.codec`, :mod:`streams.state_codec`, :mod:`streams.models`, the core.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..codec import SchemaRegistry
from ..errors import DecodeError
from ..models import AgentCall, CallPhase, Completion, PendingCall
from ..state_codec import (
    SEPARATOR,
    LegacyLayout,
    OpenCallLayout,
    StateCodec,
    entry_key,
    is_head_key,
)
from .assembly import Progress, step_order
from .store import Store

__all__ = ["SEPARATOR", "OpenCall", "OpenCalls", "entry_key", "is_head_key"]

_START, _END, _STEP = OpenCallLayout.START, OpenCallLayout.END, OpenCallLayout.STEP

Event = AgentCall | Completion


@dataclass(slots=True)
class OpenCall:
    """An open call as the assembly works with it: its progress, how many entries it has in the
    store, and (when cached) its events already decoded, in arrival order."""

    progress: Progress
    entries: int = 0
    events: list[Event] | None = field(default_factory=list)
    """None when unknown (read back from the store): the events are decoded at close."""
    size: int = 0
    """The bytes the cache counts for it: its decoded events' wire bytes (0 without them)."""


class OpenCalls:
    """The ``pending`` store of open calls with a bounded cache beside it; see the module."""

    def __init__(
        self,
        store: Store,
        codec: SchemaRegistry,
        *,
        # a fixed bound, not per open call: decoded, an event takes about 3.3 times its wire
        # bytes of heap (measured: 1,024 cached 1-event calls of 1.6 KB, 5.3 MiB), so 512 KiB
        # of wire bytes hold about 1.7 MiB; a worker whose open calls interleave more than
        # this misses and decodes at close (what it did before the cache)
        cache_calls: int = 1024,
        cache_bytes: int = 512 << 10,
        state: StateCodec | None = None,
    ) -> None:
        self.store = store
        self.codec = codec
        self.cache_calls = cache_calls
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[bytes, OpenCall] = OrderedDict()
        # the keys of cached calls that hold their decoded events, least recently used first
        self._decoded: OrderedDict[bytes, None] = OrderedDict()
        self._cached_bytes = 0
        state = state or StateCodec(codec)
        self.layout = state.open_calls()
        # the stored form of older versions, in a form that has one (bytes)
        self.legacy = _Legacy(codec) if state.reads_legacy else None

    def reset(self) -> None:
        """Forget the cache: another worker may have changed the store meanwhile."""
        self._cache.clear()
        self._decoded.clear()
        self._cached_bytes = 0

    # -- reading -------------------------------------------------------------------------------

    def get(self, key: bytes) -> OpenCall | None:
        """The open call under ``key`` (a call's own key), or None."""
        call = self._cache.get(key)
        if call is not None:
            self._cache.move_to_end(key)
            if call.events is not None:
                self._decoded.move_to_end(key)
            return call
        raw = self.store.get(key)
        if raw is None:
            return None
        if self.legacy is not None and self.legacy.holds(raw):
            raw = self._migrate(key, raw)
        head = self._light(raw)
        progress = Progress(head["call_id"], head["first_seen"], head["partition"])
        _count(progress, head)
        entries = 1
        while (raw := self.store.get(entry_key(key, entries))) is not None:
            _count(progress, self._light(raw))
            entries += 1
        call = OpenCall(progress, entries=entries, events=None)
        self._remember(key, call)
        return call

    def head(self, raw: bytes) -> tuple[str, int, datetime]:
        """(call_id, partition, first_seen) of a call's first entry, as stored."""
        if self.legacy is not None and self.legacy.holds(raw):
            progress = self.legacy.progress(raw)
            return progress.call_id, progress.partition, progress.first_seen
        head = self._light(raw)
        return head["call_id"], head["partition"], head["first_seen"]

    def pending_call(self, key: bytes, call: OpenCall) -> PendingCall:
        """The assembly's working view of the call, from the cached events or the store."""
        events = call.events
        if events is None:
            events = self._decode_all(key, call)
        progress = call.progress
        state = PendingCall(
            call_id=progress.call_id,
            first_seen=progress.first_seen,
            partition=progress.partition,
            bytes=progress.bytes,
        )
        steps = []
        for event in events:
            if isinstance(event, Completion):
                steps.append(event)
            elif event.phase is CallPhase.START:
                state.start = event
            else:
                state.end = event
        state.steps = step_order(steps)
        return state

    # -- writing -------------------------------------------------------------------------------

    def add(
        self, key: bytes, call: OpenCall | None, progress: Progress, event: Event, data: bytes
    ) -> OpenCall:
        """Store one applied event (``progress`` already counts it) and return the call."""
        index = 0 if call is None else call.entries
        item = _item(event, data)
        if index == 0:
            item["call_id"] = progress.call_id
            item["partition"] = progress.partition
            item["first_seen"] = progress.first_seen
        try:
            self.store.set(entry_key(key, index), self.layout.write(item))
        except BaseException:
            self.discard(key)
            raise
        if call is None:
            call = OpenCall(progress, entries=1, events=[event])
        else:
            call.progress = progress
            call.entries = index + 1
            if call.events is not None:
                call.events.append(event)
        if key in self._cache:
            self._cache.move_to_end(key)
            if call.events is not None:
                call.size += len(data)
                self._cached_bytes += len(data)
                self._decoded.move_to_end(key)
            self._trim()
        else:
            self._remember(key, call)
        return call

    def delete(self, key: bytes, call: OpenCall | None) -> None:
        """Delete every entry of the call under ``key`` (``call``: as :meth:`get` gave it)."""
        entries = call.entries if call is not None else 1
        for index in range(entries):
            self.store.delete(entry_key(key, index))
        self.discard(key)

    def call_ids(self) -> list[str]:
        return [self.head(raw)[0] for key, raw in self.store.items() if is_head_key(key)]

    # -- the cache ---------------------------------------------------------------------------

    def _remember(self, key: bytes, call: OpenCall) -> None:
        call.size = call.progress.bytes if call.events is not None else 0
        self._cache[key] = call
        if call.events is not None:
            self._decoded[key] = None
        self._cached_bytes += call.size
        self._trim()

    def discard(self, key: bytes) -> None:
        """Drop the call under ``key`` from the cache (the store is read again)."""
        cached = self._cache.pop(key, None)
        if cached is not None:
            self._cached_bytes -= cached.size
        self._decoded.pop(key, None)

    def _trim(self) -> None:
        cache, decoded = self._cache, self._decoded
        while len(cache) > self.cache_calls:
            key, old = cache.popitem(last=False)
            self._cached_bytes -= old.size
            decoded.pop(key, None)
        # past the bytes bound, the least recent calls drop their decoded events (the heap
        # they take, about 3.3 times their wire bytes) and keep their progress
        while self._cached_bytes > self.cache_bytes and len(decoded) > 1:
            key, _ = decoded.popitem(last=False)
            old = cache[key]
            self._cached_bytes -= old.size
            old.size = 0
            old.events = None

    # -- the stored form -----------------------------------------------------------------------

    def _light(self, raw: bytes) -> dict[str, Any]:
        return self.layout.light(raw)

    def _decode_all(self, key: bytes, call: OpenCall) -> list[Event]:
        events = []
        for index in range(call.entries):
            raw = self.store.get(entry_key(key, index))
            assert raw is not None, f"entry {index} of an open call is missing"
            event = self.codec.decode(self.layout.full(raw)["data"])
            assert isinstance(event, AgentCall | Completion)
            events.append(event)
        return events

    def _migrate(self, key: bytes, raw: bytes) -> bytes:
        """Rewrite a call stored as one PendingEvents value as one entry per event; returns
        its first entry."""
        assert self.legacy is not None
        record = self.legacy.read(raw)
        first: Any = b""
        for index, item in enumerate(record["events"]):
            item = {**OpenCallLayout.defaults(), **item}
            if index == 0:
                item.update(
                    call_id=record["call_id"],
                    partition=record["partition"],
                    first_seen=record["first_seen"],
                )
            value = self.layout.write(item)
            self.store.set(entry_key(key, index), value)
            first = first or value
        if not first:
            raise DecodeError("a stored open call (PendingEvents) without events")
        return first


def _item(event: Event, data: bytes) -> dict[str, Any]:
    if isinstance(event, Completion):
        kind, seq, steps = _STEP, event.seq, -1
    elif event.phase is CallPhase.START:
        kind, seq, steps = _START, -1, -1
    else:
        kind, seq = _END, -1
        steps = -1 if event.step_count is None else event.step_count
    return {  # OpenCallLayout.defaults() written out: one dict per event
        "call_id": "",
        "partition": -1,
        "first_seen": None,
        "event_id": event.event_id,
        "kind": kind,
        "seq": seq,
        "step_count": steps,
        "size": len(data),
        "data": data,
    }


def _count(progress: Progress, item: dict[str, Any]) -> None:
    """Add one stored event's item to ``progress``."""
    progress.ids.add(item["event_id"])
    progress.bytes += item["size"]
    if item["kind"] == _STEP:
        progress.seqs.add(item["seq"])
    elif item["kind"] == _START:
        progress.has_start = True
    else:
        progress.has_end = True
        progress.expected_steps = None if item["step_count"] < 0 else item["step_count"]


class _Legacy(LegacyLayout):
    """The stored form of older versions (one PendingEvents value per open call), as progress."""

    def progress(self, raw: bytes) -> Progress:
        record = self.read(raw)
        progress = Progress(record["call_id"], record["first_seen"], record["partition"])
        for item in record["events"]:
            _count(progress, item)
        return progress

