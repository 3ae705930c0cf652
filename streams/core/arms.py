"""Arms: which upstream answered a call, and what follows from it for scoring and training.

The gateway routes each call once, at its first request, and writes the decision on the call's
START (``trajstream.route.upstream``: ``trinity``, ``production``; ``trajstream.route.mode``:
``route`` or ``shadow``). Each step it records says who answered that step (``upstream``), why
production answered a step of a call routed to the policy (``fallback``), whether the step broke
after part of its answer had reached the client (``error_type``), and the policy's version
(``policy_version``). The pipeline reads them back here (:func:`call_arm`), so that both sides
of the traffic can be scored by the same reward function and compared on the same agents at
the same time:

- a call the gateway answered from **production** (not selected) is assembled and scored like
  any other, and its rewarded record says ``upstream: production``; it is **not** sent to
  Trinity (its msg_ids are production's, which Trinity never saw) and does not count in a
  commit's batch, only in the reward windows of its upstream;
- a call answered by **Trinity** (the policy) is ``upstream: trinity``; a shadowed one, whose
  recorded steps are Trinity's answers but whose user saw production's, is
  ``trinity-shadow``: trained on, and kept out of the comparison (neither arm);
- a call routed to the policy whose LLM steps production answered, every one (it fell back
  from its first request: the policy was down, slow, reloading, or its breaker open; later
  steps stay on production), is ``trinity-fallback`` (:data:`FALLBACK`): scored, never sent
  to Trinity, and counted as the policy arm's fallback, in neither arm's mean (what the
  policy did not answer is no evidence of its quality);
- a call routed to the policy that Trinity answered in part and production in part, or with
  a step of the policy that broke after part of its answer reached the client, is ``mixed``
  (:data:`MIXED`): scored and counted like a fallback, in neither arm's mean, and not sent to
  Trinity, because its later steps answer what another model said: the reward of the call is
  not the policy's. ``reward.train_mixed`` sends the steps Trinity answered in full
  (:func:`trained_msg_ids`);
- a call that no gateway routed (the SDK, OTLP) carries no upstream (None): only selected calls
  are assembled, and all of them are trained.

The assemble stage writes :func:`call_arm` on the trajectory (``Trajectory.upstream``), with
:func:`policy_version_of` its steps, and the reward stage copies both on the rewarded record.
Whatever the arm, only a response id Trinity issued can be a msg_id
(:attr:`~streams.models.Completion.msg_id`).

The comparison's two arms are :data:`POLICY` (``trinity``) and :data:`PRODUCTION`.

May import: the standard library, :mod:`streams.models`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..models import AgentCall, Completion, RewardedTrajectory, StepKind, Trajectory

__all__ = [
    "FALLBACK",
    "MIXED",
    "POLICY",
    "PRODUCTION",
    "ROUTED_TO_POLICY",
    "SHADOW",
    "UNTRAINED",
    "UPSTREAM_ATTRIBUTE",
    "arm_of",
    "call_arm",
    "policy_version_of",
    "routed_upstream",
    "scored_unselected",
    "trained_msg_ids",
    "trains",
    "untrained_reason",
]

UPSTREAM_ATTRIBUTE = "trajstream.route.upstream"
POLICY = "trinity"
PRODUCTION = "production"
SHADOW = "trinity-shadow"
FALLBACK = "trinity-fallback"
MIXED = "mixed"

ROUTED_TO_POLICY = (POLICY, FALLBACK, MIXED)
"""The arms of a call the gateway routed to the policy: what a fallback rate is a share of."""

UNTRAINED = (PRODUCTION, FALLBACK, MIXED)
"""Arms whose rewards hold no training: no drift alert, no commit hold (a mixed call's steps
may still be trained, with ``reward.train_mixed``)."""


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


def _by_production(step: Completion) -> bool:
    return step.upstream == PRODUCTION or step.fallback is not None


def call_arm(start: AgentCall | None, steps: Iterable[Completion]) -> str | None:
    """The call's arm, from its START (the gateway's route) and its LLM steps (who answered
    each): :func:`routed_upstream`, except for a call routed to the policy that production
    answered in whole (:data:`FALLBACK`) or in part, or whose policy step broke (:data:`MIXED`).

    >>> from streams.models import Completion, utcnow
    >>> def s(seq, **kw): return Completion(
    ...     event_id=f"c/{seq}", call_id="c", seq=seq, event_time=utcnow(), **kw)
    >>> routed = AgentCall(event_id="c/s", call_id="c", phase="START", event_time=utcnow(),
    ...     attributes={UPSTREAM_ATTRIBUTE: "trinity"})
    >>> call_arm(routed, [s(0, upstream="trinity"), s(1, upstream="trinity")])
    'trinity'
    >>> call_arm(routed, [s(0, upstream="production", fallback="connect")])
    'trinity-fallback'
    >>> call_arm(routed, [s(0, upstream="trinity"), s(1, upstream="production", fallback="sticky")])
    'mixed'
    """
    routed = routed_upstream(start)
    if routed != POLICY:
        return routed
    llm = [s for s in steps if s.kind is StepKind.LLM]
    production = sum(map(_by_production, llm))
    broke = any(s.error_type for s in llm if not _by_production(s))
    if not production and not broke:
        return POLICY
    if production == len(llm):
        return FALLBACK
    return MIXED


def policy_version_of(steps: Iterable[Completion]) -> int | None:
    """The oldest policy version among the steps Trinity answered (a call answered by two
    versions counts for the older, so a version's evidence holds no answer of an older one);
    None when no step carries one."""
    versions = [s.policy_version for s in steps if s.fallback is None]
    return min((v for v in versions if v is not None), default=None)


def scored_unselected(start: AgentCall | None) -> bool:
    """Whether a call that the workers' strategy does not select is still assembled and scored:
    yes when a gateway routed it. Production's calls are the comparison's production arm; a
    call the gateway sent to Trinity was answered by the policy whatever the workers' own
    strategy says (the gateway's route is the decision that counts), so it is the policy arm,
    and trained on."""
    return routed_upstream(start) is not None


def trained_msg_ids(trajectory: Trajectory, *, train_mixed: bool = False) -> list[str]:
    """The msg_ids a trajectory's reward is sent for: every msg_id of its LLM steps, none for a
    call production answered (production, fallback), and for a mixed call none, or with
    ``train_mixed`` those of the steps Trinity answered in full (not one that broke)."""
    arm = trajectory.upstream
    if arm in (PRODUCTION, FALLBACK):
        return []
    if arm == MIXED:
        if not train_mixed:
            return []
        return [
            s.msg_id
            for s in trajectory.steps
            if s.kind is StepKind.LLM and s.msg_id and not s.error_type
        ]
    return trajectory.msg_ids


def trains(rewarded: RewardedTrajectory) -> bool:
    """Whether the rewarded trajectory is sent to Trinity: all but production's and fallbacks;
    a mixed call only when it names msg_ids (``reward.train_mixed``)."""
    if rewarded.upstream in (PRODUCTION, FALLBACK):
        return False
    if rewarded.upstream == MIXED:
        return bool(rewarded.msg_ids)
    return True


def untrained_reason(rewarded: RewardedTrajectory) -> str:
    """Why :func:`trains` says no, in a few words (for reports and logs)."""
    if rewarded.upstream == FALLBACK:
        return "routed to the policy, answered by production (fallback): scored, not trained"
    if rewarded.upstream == MIXED:
        return "answered in part by production (mixed): scored, not trained"
    return "answered by production: scored, not trained"


def arm_of(upstream: str | None) -> str | None:
    """The comparison arm of an upstream: ``trinity`` or ``production``; None for the rest."""
    return upstream if upstream in (POLICY, PRODUCTION) else None
