"""What one process remembers of the calls it serves (step seqs, shadow answers on their way;
the decision itself needs none), its counters, and the records made once.

May import: the models, :mod:`..routing`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...models import Completion
from ..jobs import one_step_end as one_step_end  # re-exported: its old home
from ..routing import Route

# -- per-process memory of calls (step counts; the decision itself needs none) ---------------

@dataclass(slots=True)
class CallState:
    """One call of the table: its route and the step seqs recorded, and in shadow mode what
    is on its way. Route mode keeps one object per call that the cyclic garbage collector
    scans (the seqs are the bits of an int, the shadow mode containers made at first use): a
    table of 100,000 open calls is scanned in a few ms, where a set and two containers per call
    made every full collection of the serving process take 100-180 ms (measured in the gateway
    benchmark: the tail of the added latency)."""

    route: Route  # shared between calls decided alike (see Gateway._route)
    seen: int = 0
    """bit ``seq`` set: step ``seq`` is recorded"""
    pending: set[asyncio.Task[Any]] | None = None
    """shadow mode: the steps waiting for Trinity's answer (None: none yet)"""
    shadows: dict[int, asyncio.Future[tuple[dict[str, Any], float] | None]] | None = None
    """shadow mode: Trinity's answer on its way, by the seq of the step it joins"""
    fallback: str | None = None
    """route mode, a call routed to Trinity: why its first request that fell back did (from
    then on production answers the call: ``sticky``)"""

    def has(self, seq: int) -> bool:
        """Whether step ``seq`` is recorded."""
        return seq >= 0 and (self.seen >> seq) & 1 == 1

    def add(self, seq: int) -> None:
        """Step ``seq`` is recorded."""
        if seq < 0:
            raise ValueError(f"a step seq is not negative: {seq}")
        self.seen |= 1 << seq

    @property
    def steps(self) -> int:
        """How many steps are recorded."""
        return self.seen.bit_count()

    def await_shadow(
        self, seq: int, answer: asyncio.Future[tuple[dict[str, Any], float] | None]
    ) -> None:
        """Trinity's ``answer`` to step ``seq``'s request is on its way."""
        if self.shadows is None:
            self.shadows = {}
        self.shadows[seq] = answer

    def take_shadow(self, seq: int) -> asyncio.Future[tuple[dict[str, Any], float] | None] | None:
        """Trinity's answer on its way for step ``seq``, taken (None: none)."""
        return self.shadows.pop(seq, None) if self.shadows else None

    def watch(self, task: asyncio.Task[Any]) -> None:
        """A step waiting for its shadow answer: ``/end`` waits for it."""
        if self.pending is None:
            self.pending = set()
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def cancel_shadows(self) -> None:
        """Trinity's answers no recorded step waits for (the call ended)."""
        for shadow in (self.shadows or {}).values():
            shadow.cancel()


class CallTable:
    """The calls this process has seen, least recently used dropped past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._calls: OrderedDict[str, CallState] = OrderedDict()

    def get(self, call_id: str) -> CallState | None:
        state = self._calls.get(call_id)
        if state is not None:
            self._calls.move_to_end(call_id)
        return state

    def add(self, call_id: str, state: CallState) -> CallState:
        self._calls[call_id] = state
        while len(self._calls) > self.limit:
            self._calls.popitem(last=False)
        return state

    def pop(self, call_id: str) -> CallState | None:
        return self._calls.pop(call_id, None)

    def __len__(self) -> int:
        return len(self._calls)


@dataclass(slots=True)
class Timing:
    """A request's time waiting on its upstream (the rest is the gateway's overhead)."""

    upstream_s: float = 0.0
    stream: bool = False


@dataclass
class GatewayStats:
    requests: int = 0
    rejected: int = 0
    upstream_errors: int = 0
    answered: dict[str, int] = field(default_factory=lambda: {"trinity": 0, "production": 0})
    shadow_failures: int = 0
    unauthorized: int = 0
    rate_limited: int = 0
    ack_timeouts: int = 0
    handover_timeouts: int = 0


class Once:
    """A record built at most once (the step, and the END of a one-step call made from it)."""

    __slots__ = ("_build", "_value")

    def __init__(self, build: Callable[[], Completion]) -> None:
        self._build: Callable[[], Completion] | None = build
        self._value: Completion | None = None

    def __call__(self) -> Completion:
        if self._build is not None:
            self._value, self._build = self._build(), None
        assert self._value is not None
        return self._value
