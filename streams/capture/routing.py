"""Routing: which upstream answers a call, decided once, at its first request.

The decision is the workers' own selection strategy (:mod:`streams.select`), evaluated on what is
known when a call starts: its id, its agent name and its training mark. It is a pure function of
those, so every gateway replica, every restart and the workers decide the same way, and it is
published with the call (the START's ``trajstream.route.*`` attributes).

A strategy is routable when it can decide from the start. The built-in ones can: ``sampling``
(the hash of the call id), ``marked`` (whether the call carries a mark), ``per-agent``, and
``any``/``all`` of routable ones. ``per-model`` cannot: it decides by the model of the call's last
step, known only when the call ends. A plugin declares that it can with a class attribute
``decides_at_start = True``; any other plugin is refused at start with a :class:`ConfigError`.

The decision is the selection: the workers select a call exactly as its START's
``trajstream.route.selected`` says (:func:`streams.core.select.routed_selection`), so a call
Trinity answered is trained on however long it runs, and a mark that arrives only with END is
recorded (its labels reach the rewards) but selects nothing. A mark's TTL is checked once, here:
against the time of the call's first request.

With ``gateway.rollout`` on, the strategy is a :class:`RolloutStrategy`: the policy's share of
each agent's traffic is what the ledger owner last wrote on ``<p>.routing``
(:mod:`streams.core.rollout`), kept in a :class:`ShareBook` that a follower of that topic fills
(:mod:`streams.capture.routing_follow`). A call goes to Trinity when its hash
(:func:`~streams.core.select.sample_point` of its call id) is below the share **in force at the
call's start**: each change carries an ``effective_at`` a little after its decision, and every
replica that has read it decides a call that starts after that moment with the new share, and
one that started before with the old, so replicas agree on every call whatever the moment each
read the change. An agent with no share yet is routed by the configured strategy.

This module imports only the models, the selection code and the errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..core.select import (
    AllOf,
    AnyOf,
    CallView,
    ExplicitMark,
    PerKey,
    SamplingRate,
    Strategy,
    sample_point,
)
from ..errors import ConfigError
from ..models import AgentCall, RoutingShare, Selection

__all__ = [
    "ROUTE_ATTRIBUTES",
    "RolloutStrategy",
    "Route",
    "ShareBook",
    "check_routable",
    "decide_route",
]

ROUTE_ATTRIBUTES = (
    "trajstream.route.upstream",
    "trajstream.route.mode",
    "trajstream.route.selected",
    "trajstream.route.strategy",
    "trajstream.route.reason",
)
"""The START attributes that carry the routing decision."""


@dataclass(frozen=True, slots=True)
class Route:
    """A call's routing decision."""

    selection: Selection
    mode: str
    """``route`` or ``shadow``."""

    @property
    def upstream(self) -> str:
        """Who answers the agent: ``trinity`` (selected, route mode) or ``production``."""
        return "trinity" if self.selection.selected and self.mode == "route" else "production"

    @property
    def shadow(self) -> bool:
        """Whether each request also goes to Trinity, whose answer is recorded."""
        return self.selection.selected and self.mode == "shadow"

    @property
    def recorded_upstream(self) -> str:
        """The upstream whose answer is recorded as the step: the one the client saw (in shadow
        mode Trinity's answer travels beside it, ``Completion.shadow_*``)."""
        return self.upstream

    def attributes(self) -> dict[str, str]:
        values = (
            self.upstream,
            self.mode,
            "true" if self.selection.selected else "false",
            self.selection.strategy,
            self.selection.reason,
        )
        return dict(zip(ROUTE_ATTRIBUTES, values, strict=True))


def check_routable(strategy: Strategy, spec: str = "") -> None:
    """Raise ConfigError when ``strategy`` cannot decide at a call's first request."""
    why = _not_routable(strategy)
    if why is not None:
        shown = f" {spec!r}" if spec else ""
        raise ConfigError(
            f"selection.strategy{shown} cannot route calls: {why}. The gateway decides at a "
            "call's first request; use sampling, marked, per-agent, any/all of them, or a plugin "
            "with decides_at_start = True"
        )


def _not_routable(strategy: Strategy) -> str | None:
    if isinstance(strategy, SamplingRate | ExplicitMark):
        return None
    if isinstance(strategy, AnyOf | AllOf):
        return next((w for w in map(_not_routable, strategy.strategies) if w), None)
    if isinstance(strategy, PerKey):
        if strategy.by != "agent":
            return f"{strategy.name} decides by the model of the call's last step"
        inner = [*strategy.strategies.values(), strategy.default]
        return next((w for w in map(_not_routable, inner) if w), None)
    if getattr(strategy, "decides_at_start", False) is True:
        return None
    return (
        f"plugin {type(strategy).__module__}.{type(strategy).__qualname__} may need the finished "
        "call (it does not declare decides_at_start = True)"
    )


def decide_route(strategy: Strategy, start: AgentCall, mode: str) -> Route:
    """The decision for the call that ``start`` opens.

    The strategy sees the call as ending at its first request (``start.event_time``), so a
    mark's TTL is checked at the decision. A mark without ``marked_at`` is made at that
    request, so the decision depends on the call id, agent and mark only: a replica that sees
    the call's third request decides as the one that saw its first (unless the agent sends a
    ``marked_at`` that expires in between; replicas sticky per call never decide twice).
    """
    at: datetime = start.event_time
    view = CallView(start.call_id, start, None, None, at)
    return Route(strategy.decide(view), mode)


class ShareBook:
    """The routing changes a replica has read, per agent, the last ``history`` versions of each.

    Each version is applied once (a redelivery is ignored) and kept in version order, whatever
    the order it was read in: the topic is one partition, so a replica reads in order, but one
    that starts on a compacted topic sees only the newest change of each agent first."""

    def __init__(self, history: int = 16) -> None:
        self.history = history
        self._by_agent: dict[str, list[RoutingShare]] = {}

    def apply(self, change: RoutingShare) -> bool:
        """Add ``change``; False when this book has that version already (or it is older than
        every version kept)."""
        kept = self._by_agent.setdefault(change.agent_name, [])
        if any(c.version == change.version for c in kept):
            return False
        if len(kept) >= self.history and change.version < kept[0].version:
            return False
        kept.append(change)
        kept.sort(key=lambda c: c.version)
        del kept[: -self.history]
        return True

    def share_at(self, agent: str, at: datetime) -> RoutingShare | None:
        """The change in force for a call of ``agent`` starting at ``at``: the newest whose
        ``effective_at`` is not after it (None: none yet)."""
        for change in reversed(self._by_agent.get(agent, [])):
            if change.effective_at <= at:
                return change
        return None

    def latest(self) -> dict[str, RoutingShare]:
        """Each agent's newest change (in force now, or soon)."""
        return {agent: kept[-1] for agent, kept in self._by_agent.items() if kept}


class RolloutStrategy:
    """Route by the share in force at the call's start (see the module docstring); agents
    without a share are decided by ``fallback``."""

    decides_at_start = True

    def __init__(self, fallback: Strategy, book: ShareBook) -> None:
        check_routable(fallback)
        self.fallback = fallback
        self.book = book

    @property
    def name(self) -> str:
        return f"rollout({self.fallback.name})"

    def decide(self, call: CallView) -> Selection:
        change = self.book.share_at(call.agent_name or "-", call.ended_at)
        if change is None:
            return self.fallback.decide(call)
        hit = sample_point(call.call_id) < change.share
        return Selection(
            selected=hit,
            strategy=f"rollout(v{change.version})",
            reason="rollout-policy" if hit else "rollout-production",
        )
