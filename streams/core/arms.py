"""Arms: which upstream answered a call, and what follows from it for scoring and training.

The gateway routes each call once, at its first request, and writes the decision on the call's
START (``trajstream.route.upstream``: ``trinity``, ``production``; ``trajstream.route.mode``:
``route`` or ``shadow``). The pipeline reads it back here, so that both sides of the traffic
can be scored by the same reward function and compared on the same agents at the same time:

- a call the gateway answered from **production** (not selected) is assembled and scored like
  any other, and its rewarded record says ``upstream: production``; it is **not** sent to
  Trinity (its msg_ids are production's, which Trinity never saw) and does not count in a
  commit's batch, only in the reward windows of its upstream;
- a call answered by **Trinity** (the policy) is ``upstream: trinity``; a shadowed one, whose
  recorded steps are Trinity's answers but whose user saw production's, is
  ``trinity-shadow``: trained on, and kept out of the comparison (neither arm);
The assemble stage writes :func:`routed_upstream` on the trajectory (``Trajectory.upstream``)
and the reward stage copies it on the rewarded record.

- a call that no gateway routed (the SDK, OTLP) carries no upstream (None): it is handled as
  before this module existed (only selected calls are assembled, and all of them are trained).

The comparison's two arms are :data:`POLICY` (``trinity``) and :data:`PRODUCTION`.

May import: the standard library, :mod:`streams.models`.
"""

from __future__ import annotations

from ..models import AgentCall, RewardedTrajectory

__all__ = [
    "POLICY",
    "PRODUCTION",
    "SHADOW",
    "UPSTREAM_ATTRIBUTE",
    "arm_of",
    "routed_upstream",
    "scored_unselected",
    "trains",
]

UPSTREAM_ATTRIBUTE = "trajstream.route.upstream"
POLICY = "trinity"
PRODUCTION = "production"
SHADOW = "trinity-shadow"


def routed_upstream(start: AgentCall | None) -> str | None:
    """The upstream a gateway routed the call to (its START attribute), None when not routed."""
    if start is None:
        return None
    upstream = start.attributes.get(UPSTREAM_ATTRIBUTE)
    if not upstream:
        return None
    if upstream == POLICY and start.attributes.get("trajstream.route.mode") == "shadow":
        return SHADOW  # not expected (shadowed calls are answered by production), but safe
    if upstream == PRODUCTION and start.attributes.get("trajstream.route.selected") == "true":
        return SHADOW  # selected in shadow mode: production answered, Trinity's answer recorded
    return upstream


def scored_unselected(start: AgentCall | None) -> bool:
    """Whether a call that the workers' strategy does not select is still assembled and scored:
    yes when a gateway routed it. Production's calls are the comparison's production arm; a
    call the gateway sent to Trinity was answered by the policy whatever the workers' own
    strategy says (the gateway's route is the decision that counts), so it is the policy arm,
    and trained on."""
    return routed_upstream(start) is not None


def trains(rewarded: RewardedTrajectory) -> bool:
    """Whether the rewarded trajectory is sent to Trinity (all but production's)."""
    return rewarded.upstream != PRODUCTION


def arm_of(upstream: str | None) -> str | None:
    """The comparison arm of an upstream: ``trinity`` or ``production``; None for the rest."""
    return upstream if upstream in (POLICY, PRODUCTION) else None
