"""Selection: which finished agent calls become training data.

A strategy looks at a finished call (its start and end events) and returns a
:class:`~streams.models.Selection`: selected or not, which strategy decided, and why. Strategies
are pure and deterministic, so every worker, every restart and every replay decides the same way
for the same call.

- :class:`SamplingRate` selects a fixed fraction of calls. The draw is not random: it is
  ``sha256(call_id)``'s first 8 bytes, read as a big-endian unsigned integer and divided by
  2**64, compared with the rate. Agents can compute the same number to know in advance which of
  their calls will be selected (for example to route those to Trinity)::

      int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big") / 2**64 < rate

- :class:`ExplicitMark` selects calls whose producer attached a training mark, unless the mark
  is older than its TTL when the call ends (reason ``expired``) or was made after the call
  ended by more than the allowed clock skew (reason ``mark-from-future``).
- :class:`AnyOf` / :class:`AllOf` combine strategies; :class:`PerKey` picks a strategy by agent
  name or model (``per-agent(support-bot=sampling:0.5,*=sampling:0.05)``).
- Plugins: any class with ``name`` and ``decide(call) -> Selection`` (the :class:`Strategy`
  protocol), named by dotted path ``package.module:Class`` in the settings.

May import: the standard library, :mod:`streams.models`, :mod:`streams.errors`, the core.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

from ..errors import ConfigError
from ..models import AgentCall, Selection, TrainingMark
from .plugins import load_object

__all__ = [
    "ROUTED_SELECTED",
    "AllOf",
    "AnyOf",
    "CallView",
    "ExplicitMark",
    "PerKey",
    "SamplingRate",
    "Strategy",
    "build_strategy",
    "routed_selection",
    "sample_point",
]

ROUTED_SELECTED = "trajstream.route.selected"
"""The START attribute a gateway (or the routing client wrapper) sets when it routed the call."""


def routed_selection(start: AgentCall | None) -> Selection | None:
    """The selection a gateway made at the call's first request, published on its START
    (``trajstream.route.selected``, ``.strategy``, ``.reason``), or None for a call captured
    without one. A routed call is selected exactly as it was routed: in route mode the calls
    Trinity answered, in shadow mode the calls shadowed; a mark that arrives later (on END) is
    kept on the trajectory but changes nothing, and the mark's TTL was checked at the decision.
    """
    if start is None:
        return None
    flag = start.attributes.get(ROUTED_SELECTED)
    if flag not in ("true", "false"):
        return None
    return Selection(
        selected=flag == "true",
        strategy=start.attributes.get("trajstream.route.strategy") or "gateway",
        reason=start.attributes.get("trajstream.route.reason") or "routed",
    )


@dataclass(frozen=True, slots=True)
class CallView:
    """What a strategy may look at: the call's start and end (either may be missing when a call
    is closed as abandoned or oversized) and the time of its last event."""

    call_id: str
    start: AgentCall | None
    end: AgentCall | None
    model: str | None = None
    last_event_time: datetime | None = None

    @property
    def agent_name(self) -> str | None:
        for event in (self.end, self.start):
            if event is not None and event.agent_name:
                return event.agent_name
        return None

    @property
    def mark(self) -> TrainingMark | None:
        for event in (self.end, self.start):
            if event is not None and event.mark is not None:
                return event.mark
        return None

    @property
    def ended_at(self) -> datetime:
        """When the call ended: its END's event time, else its last event's."""
        if self.end is not None:
            return self.end.event_time
        if self.last_event_time is not None:
            return self.last_event_time
        if self.start is not None:
            return self.start.event_time
        raise ValueError(f"call {self.call_id} has no event with a time")


@runtime_checkable
class Strategy(Protocol):
    """A selection strategy: a name for the records and a pure decision per finished call."""

    @property
    def name(self) -> str: ...

    def decide(self, call: CallView) -> Selection: ...


def sample_point(call_id: str) -> float:
    """The call's stable position in [0, 1): selected by a rate p when below p."""
    digest = hashlib.sha256(call_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class SamplingRate:
    rate: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ConfigError(f"sampling rate must be between 0 and 1, got {self.rate}")

    @property
    def name(self) -> str:
        return f"sampling({self.rate:g})"

    def decide(self, call: CallView) -> Selection:
        hit = sample_point(call.call_id) < self.rate
        return Selection(
            selected=hit, strategy=self.name, reason="sampled" if hit else "not-sampled"
        )


@dataclass(frozen=True)
class ExplicitMark:
    ttl: timedelta = timedelta(minutes=1)
    max_skew: timedelta = timedelta(seconds=5)

    @property
    def name(self) -> str:
        return f"marked(ttl={self.ttl.total_seconds():g}s)"

    def decide(self, call: CallView) -> Selection:
        mark = call.mark
        if mark is None:
            return Selection(selected=False, strategy=self.name, reason="unmarked")
        age = call.ended_at - mark.marked_at
        if age < -self.max_skew:
            return Selection(selected=False, strategy=self.name, reason="mark-from-future")
        if age > self.ttl:
            return Selection(selected=False, strategy=self.name, reason="expired")
        return Selection(selected=True, strategy=self.name, reason="marked")


@dataclass(frozen=True)
class AnyOf:
    strategies: Sequence[Strategy]

    @property
    def name(self) -> str:
        return "any(" + ",".join(s.name for s in self.strategies) + ")"

    def decide(self, call: CallView) -> Selection:
        reasons = []
        for strategy in self.strategies:
            decision = strategy.decide(call)
            if decision.selected:
                return decision
            reasons.append(decision.reason)
        return Selection(selected=False, strategy=self.name, reason=",".join(reasons))


@dataclass(frozen=True)
class AllOf:
    strategies: Sequence[Strategy]

    @property
    def name(self) -> str:
        return "all(" + ",".join(s.name for s in self.strategies) + ")"

    def decide(self, call: CallView) -> Selection:
        reasons = []
        for strategy in self.strategies:
            decision = strategy.decide(call)
            if not decision.selected:
                return decision
            reasons.append(decision.reason)
        return Selection(selected=True, strategy=self.name, reason=",".join(reasons))


@dataclass(frozen=True)
class PerKey:
    """A strategy per agent name (or model), with a default for the others."""

    by: str  # "agent" or "model"
    strategies: Mapping[str, Strategy]
    default: Strategy

    @property
    def name(self) -> str:
        return f"per-{self.by}"

    def decide(self, call: CallView) -> Selection:
        key = call.agent_name if self.by == "agent" else call.model
        return self.strategies.get(key or "", self.default).decide(call)


def build_strategy(
    spec: str,
    *,
    rate: float = 0.1,
    mark_ttl: timedelta = timedelta(minutes=1),
    loader: Callable[[str], object] = load_object,
) -> Strategy:
    """Build a strategy from its settings spelling.

    ``sampling``, ``sampling:0.25``, ``marked``, ``marked:120`` (TTL seconds),
    ``any(marked,sampling:0.1)``, ``all(...)``, or a plugin ``package.module:Class``
    (instantiated without arguments).
    """
    spec = spec.strip()
    for combinator, cls in (("any(", AnyOf), ("all(", AllOf)):
        if spec.startswith(combinator) and spec.endswith(")"):
            inner = _split_top(spec[len(combinator) : -1])
            if not inner:
                raise ConfigError(f"selection strategy {spec!r} combines nothing")
            return cls(
                [build_strategy(s, rate=rate, mark_ttl=mark_ttl, loader=loader) for s in inner]
            )
    for by in ("agent", "model"):
        opener = f"per-{by}("
        if spec.startswith(opener) and spec.endswith(")"):
            return _per_key(by, spec, _split_top(spec[len(opener) : -1]), rate, mark_ttl, loader)
    head, _, arg = spec.partition(":")
    if head == "sampling":
        return SamplingRate(_number(spec, arg) if arg else rate)
    if head == "marked":
        if not arg:
            return ExplicitMark(mark_ttl)
        ttl = _number(spec, arg)
        if not (math.isfinite(ttl) and 0 < ttl < 10**9):
            raise ConfigError(
                f"selection strategy {spec!r}: the TTL must be a positive number of seconds"
            )
        return ExplicitMark(timedelta(seconds=ttl))
    if ("." in head and arg) or _is_entry_point(spec):
        obj = loader(spec)
        strategy = obj() if isinstance(obj, type) else obj
        if not isinstance(strategy, Strategy):
            raise ConfigError(f"selection plugin {spec!r} has no name and decide(call)")
        return strategy
    raise ConfigError(
        f"unknown selection strategy {spec!r}: use sampling[:rate], marked[:ttl_seconds], "
        "any(...), all(...), per-agent(name=...,*=...), per-model(...), package.module:Class "
        "or the name of a trajstream.strategies entry point"
    )


def _is_entry_point(name: str) -> bool:
    return any(ep.name == name for ep in entry_points(group="trajstream.strategies"))


def _per_key(
    by: str,
    spec: str,
    items: list[str],
    rate: float,
    mark_ttl: timedelta,
    loader: Callable[[str], object],
) -> PerKey:
    strategies: dict[str, Strategy] = {}
    default: Strategy | None = None
    for item in items:
        key, eq, inner = item.partition("=")
        if not eq or not key.strip() or not inner.strip():
            raise ConfigError(f"selection strategy {spec!r}: {item!r} is not {by}=strategy")
        strategy = build_strategy(inner, rate=rate, mark_ttl=mark_ttl, loader=loader)
        if key.strip() == "*":
            default = strategy
        else:
            strategies[key.strip()] = strategy
    if default is None:
        raise ConfigError(f"selection strategy {spec!r} needs a default: *=strategy")
    return PerKey(by, strategies, default)


def _number(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"selection strategy {spec!r}: {text!r} is not a number") from None


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        current += ch
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]
