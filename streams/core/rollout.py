"""The rollout: the policy's share of an agent's traffic, moved by the comparison's evidence.

``gateway.rollout`` (off by default). The ledger owner, the one decision maker of the
deployment, applies each agent's per-window :class:`~streams.models.Comparison` to that agent's
:class:`~streams.models.AgentRollout` (kept in the ledger state) and writes every change as a
:class:`~streams.models.RoutingShare` on the compacted ``<p>.routing`` topic, with its evidence.
The gateway replicas read that topic and route a call to Trinity when its hash is below the
share in force at the call's start (:mod:`streams.capture.routing`).

The rule, per agent, on each window, oldest first. The window's judged comparison
(:func:`judged`) is the one of the **newest policy version that has enough calls** in it (a
verdict other than ``insufficient``; the newest version when none has), or, when no call of the
window names a version, the window's own (every call pooled): a checkpoint is judged on its own
answers, not pooled with the one it replaced. Then:

- the first comparison of an agent starts it at ``initial_share`` (action ``start``);
- ``better`` counts a win and resets the losses; ``worse`` counts a loss and resets the wins;
  ``inconclusive`` and ``insufficient`` reset both (streaks are of consecutive windows). Wins
  count for one version: a win of another version than the streak's starts a new streak (the
  policy that would get more traffic must have won it); losses count whatever the version;
- ``promote_after`` consecutive wins raise the share by ``step`` up to ``max_share`` (action
  ``promote``), and the streak starts again: each further step needs as many new wins. Not
  while the window's ``fallback_rate`` (calls routed to the policy that production answered, in
  whole or in part) is above ``max_fallback_rate``: the share stays, a ``blocked`` change says
  why, and the streak starts again;
- ``rollback_after`` consecutive losses set the share to ``floor`` (action ``rollback``; 0 by
  default: production answers everything), and so does a drift alert on the policy's windows
  of the agent (action ``drift``). A rollback also holds commits (a
  :class:`~streams.models.CommitHold` with ``reason = "rollback"``) and blocks promotion until
  an operator resumes (``trajstream routing resume``): the hysteresis that keeps a policy that
  just lost from climbing back on one lucky window;
- an operator's ``trajstream routing set`` pins a share (action ``set``): no automatic change
  while pinned; ``trajstream routing resume`` unpins, clears a rollback and its hold (action
  ``resume``), and the streaks start from zero.

Every change takes effect ``apply_delay`` after the decision (``effective_at``), so that every
gateway replica has read it before the first call it applies to starts, and names the policy
version it judged (``policy_version``: a rollback names the version that lost).

May import: the standard library, :mod:`streams.models`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ..models import (
    AgentRollout,
    CommitHold,
    Comparison,
    DriftAlert,
    LedgerState,
    RoutingOverride,
    RoutingShare,
)

__all__ = [
    "ROLLBACK",
    "RolloutConfig",
    "apply_override",
    "decide_rollout",
    "judged",
    "rollout_of",
]

ROLLBACK = "rollback"
"""The reason of a commit hold that a rollback started."""


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    enabled: bool = False
    initial_share: float = 0.05
    step: float = 0.1
    max_share: float = 0.5
    floor: float = 0.0
    promote_after: int = 3
    rollback_after: int = 1
    apply_delay: timedelta = timedelta(seconds=5)
    max_fallback_rate: float = 0.1


def rollout_of(state: LedgerState, agent: str) -> AgentRollout | None:
    return next((r for r in state.rollout if r.agent_name == agent), None)


def _change(
    state: LedgerState,
    current: AgentRollout,
    share: float,
    action: str,
    reason: str,
    now: datetime,
    cfg: RolloutConfig,
    evidence: list[Comparison],
    requested_by: str = "",
    policy_version: int | None = None,
) -> RoutingShare:
    previous = current.share
    current.share = round(min(1.0, max(0.0, share)), 9)
    current.version += 1
    current.updated_at = now
    return RoutingShare(
        agent_name=current.agent_name,
        share=current.share,
        previous_share=previous,
        version=current.version,
        effective_at=now + cfg.apply_delay,
        decided_at=now,
        action=action,
        reason=reason,
        evidence=evidence,
        requested_by=requested_by,
        policy_version=policy_version,
    )


def _hold(state: LedgerState, agent: str, evidence: Comparison | None, now: datetime) -> None:
    if any(h.agent_name == agent and h.reason == ROLLBACK for h in state.holds):
        return
    state.holds.append(
        CommitHold(
            agent_name=agent,
            model="*",
            threshold=0.0,
            window_start=evidence.window_start if evidence else now,
            mean=(evidence.difference or 0.0) if evidence else 0.0,
            since=now,
            reason=ROLLBACK,
        )
    )


def _trail(history: list[Comparison], n: int) -> list[Comparison]:
    return history[-n:] if n > 0 else []


def judged(comparisons: list[Comparison]) -> list[Comparison]:
    """The comparison the rollout judges for each agent and window among ``comparisons`` (in
    the order of their first comparison): among the window's per-version comparisons (span
    ``version``), the newest version's whose verdict is not ``insufficient``, else the newest;
    without any, the window's own (span ``window``). Trailing spans are never judged."""
    grouped: dict[tuple[str, object], list[Comparison]] = {}
    for c in comparisons:
        if c.span in ("window", "version"):
            grouped.setdefault((c.agent_name, c.window_start), []).append(c)
    out = []
    for cs in grouped.values():
        versions = sorted(
            (c for c in cs if c.span == "version" and c.policy_version is not None),
            key=lambda c: c.policy_version or 0,
            reverse=True,
        )
        enough = (c for c in versions if c.verdict != "insufficient")
        out.append(next(enough, versions[0]) if versions else cs[0])
    return out


def _of_version(c: Comparison) -> str:
    return "" if c.policy_version is None else f" (policy version {c.policy_version})"


def decide_rollout(
    state: LedgerState,
    comparisons: list[Comparison],
    alerts: list[DriftAlert],
    now: datetime,
    cfg: RolloutConfig,
    policy_models: dict[str, set[str]] | None = None,
) -> list[RoutingShare]:
    """Apply the window comparisons (and drift alerts) of one ledger decision; returns the
    changes to write on ``<p>.routing``, in order. ``policy_models`` names, per agent, the
    models of the policy's windows, to match a drift alert (by agent and model) to an agent."""
    if not cfg.enabled:
        return []
    changes: list[RoutingShare] = []
    latest: dict[str, Comparison] = {}
    for c in judged(comparisons):
        agent = c.agent_name
        latest[agent] = c
        current = rollout_of(state, agent)
        if current is None:
            current = AgentRollout(agent_name=agent, share=0.0)
            state.rollout.append(current)
            changes.append(
                _change(
                    state,
                    current,
                    cfg.initial_share,
                    "start",
                    "first comparison",
                    now,
                    cfg,
                    [c],
                    policy_version=c.policy_version,
                )
            )
        if current.pinned:
            continue
        if c.verdict == "better":
            # a win extends a streak of the same version only
            same = bool(current.streak) and current.streak[-1].policy_version == c.policy_version
            current.wins, current.losses = (current.wins + 1 if same else 1), 0
        elif c.verdict == "worse":
            current.wins, current.losses = 0, current.losses + 1
        else:
            current.wins = current.losses = 0
        streak = current.wins or current.losses
        current.streak = [*current.streak, c][-streak:] if streak else []
        history = current.streak
        if current.losses >= cfg.rollback_after and current.share > cfg.floor:
            reason = (
                f"worse than production with confidence for {current.losses} window(s)"
                f"{_of_version(c)}: difference {c.difference:.4g} in [{c.lower:.4g}, "
                f"{c.upper:.4g}]"
            )
            changes.append(
                _change(
                    state,
                    current,
                    cfg.floor,
                    "rollback",
                    reason,
                    now,
                    cfg,
                    _trail(history, cfg.rollback_after),
                    policy_version=c.policy_version,
                )
            )
            current.rolled_back, current.wins, current.losses = True, 0, 0
            current.streak = []
            _hold(state, agent, c, now)
        elif (
            current.wins >= cfg.promote_after
            and not current.rolled_back
            and current.share < cfg.max_share
        ):
            better = (
                f"better than production with confidence for {current.wins} window(s)"
                f"{_of_version(c)}: difference {c.difference:.4g} in [{c.lower:.4g}, "
                f"{c.upper:.4g}]"
            )
            rate = c.fallback_rate or 0.0
            if rate > cfg.max_fallback_rate:
                action, share = "blocked", current.share
                reason = (
                    f"not promoted: {rate:.1%} of the calls routed to the policy fell back to "
                    f"production in the last window ({c.policy_fallbacks} fallback, "
                    f"{c.policy_mixed} mixed), above gateway.rollout.max_fallback_rate "
                    f"{cfg.max_fallback_rate:.1%}; {better}"
                )
            else:
                action, reason = "promote", better
                share = min(cfg.max_share, current.share + cfg.step)
            changes.append(
                _change(
                    state,
                    current,
                    share,
                    action,
                    reason,
                    now,
                    cfg,
                    _trail(history, cfg.promote_after),
                    policy_version=c.policy_version,
                )
            )
            current.wins, current.streak = 0, []
    for alert in alerts:
        for current in state.rollout:
            models = (policy_models or {}).get(current.agent_name, set())
            if alert.agent_name != current.agent_name or alert.model not in models:
                continue
            if current.pinned or current.share <= cfg.floor:
                continue
            reason = (
                f"drift: window mean {alert.mean:.4g} < {alert.fraction:g} x trailing "
                f"{alert.trailing_mean:.4g} ({alert.model})"
            )
            last = latest.get(current.agent_name)
            changes.append(
                _change(
                    state,
                    current,
                    cfg.floor,
                    "drift",
                    reason,
                    now,
                    cfg,
                    [last] if last is not None else [],
                    policy_version=last.policy_version if last is not None else None,
                )
            )
            current.rolled_back, current.wins, current.losses = True, 0, 0
            _hold(state, current.agent_name, None, now)
    return changes


def apply_override(
    state: LedgerState, override: RoutingOverride, now: datetime, cfg: RolloutConfig
) -> tuple[RoutingShare | None, list[CommitHold]]:
    """An operator's ``routing set`` (pin a share) or ``routing resume`` (unpin, clear a
    rollback and end its commit hold). Returns the change (None when nothing changed) and the
    holds it ended."""
    agent = override.agent_name
    current = rollout_of(state, agent)
    if current is None:
        current = AgentRollout(agent_name=agent, share=0.0)
        state.rollout.append(current)
    current.wins = current.losses = 0
    current.streak = []
    who = override.requested_by or "an operator"
    if override.share is not None:
        current.pinned = True
        reason = override.reason or f"pinned by {who}"
        change = _change(
            state, current, override.share, "set", reason, now, cfg, [], override.requested_by
        )
        return change, []
    ended = [h for h in state.holds if h.agent_name == agent and h.reason == ROLLBACK]
    state.holds = [h for h in state.holds if h not in ended]
    current.pinned = current.rolled_back = False
    reason = override.reason or f"resumed by {who}"
    change = _change(
        state, current, current.share, "resume", reason, now, cfg, [], override.requested_by
    )
    return change, ended
