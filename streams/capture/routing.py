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

This module imports only the models, the selection code and the errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ..core.select import AllOf, AnyOf, CallView, ExplicitMark, PerKey, SamplingRate, Strategy
from ..errors import ConfigError
from ..models import AgentCall, Selection

__all__ = ["ROUTE_ATTRIBUTES", "Route", "check_routable", "decide_route"]

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
    view = CallView(start.call_id, start.model_copy(update={"event_time": at}), None, None, at)
    return Route(strategy.decide(view), mode)
