"""The policy against production, for people: read, recompute, print.

:func:`read_policy` reads what the ledger owner published (``<p>.comparisons``, ``<p>.routing``)
and, for a recomputation, what it decided from (``<p>.windows``, ``<p>.alerts``).
:func:`replay_decisions` recomputes the comparisons and the rollout's decisions from the closed
windows, decision by decision (the windows one ledger decision closed share its ``emitted_at``),
through the same functions as the live ledger (:func:`streams.core.compare.compare_windows`,
:func:`streams.core.rollout.decide_rollout`): with the live settings it reproduces what was
published, with others (``compare.level``, ``gateway.rollout.*``) it shows what they would have
decided on the same traffic. :func:`render` prints a table per agent: per window, both arms,
the policy's fallbacks beside them, the version that answered, and, for a window that several
versions answered, one row per version (``--version`` keeps one version's).

May import: the core, the models, :mod:`.reader` (its TopicReader), rich.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..core.arms import POLICY
from ..core.compare import compare_windows
from ..core.ledger import LedgerConfig, window_order
from ..core.rollout import apply_override, decide_rollout
from ..models import (
    Comparison,
    DriftAlert,
    LedgerState,
    RoutingOverride,
    RoutingShare,
    WindowSummary,
)
from ..topics import Topics
from .reader import TopicReader

__all__ = ["PolicyView", "read_policy", "render", "replay_decisions"]


@dataclass
class PolicyView:
    comparisons: list[Comparison] = field(default_factory=list)
    routing: list[RoutingShare] = field(default_factory=list)

    def of(
        self, agent: str | None, since: datetime | None = None, version: int | None = None
    ) -> PolicyView:
        """The comparisons and routing changes of ``agent`` from ``since`` on (None: all);
        with ``version``, only what names that policy version (a window's comparison when
        that version alone answered it, or the version's own comparison of a window several
        answered; the changes that judged it)."""

        def keep(name: str, at: datetime, judged: int | None) -> bool:
            return (
                agent in (None, name)
                and (since is None or at >= since)
                and version in (None, judged)
            )

        return PolicyView(
            [c for c in self.comparisons if keep(c.agent_name, c.window_end, c.policy_version)],
            [r for r in self.routing if keep(r.agent_name, r.decided_at, r.policy_version)],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "comparisons": [c.model_dump(mode="json") for c in self.comparisons],
            "routing": [r.model_dump(mode="json") for r in self.routing],
        }


def replay_decisions(
    summaries: Iterable[WindowSummary],
    alerts: Iterable[DriftAlert],
    cfg: LedgerConfig,
    overrides: Iterable[tuple[datetime, RoutingOverride]] = (),
) -> PolicyView:
    """The comparisons and routing changes the ledger makes from these closed windows (and
    drift alerts, and operators' overrides at the times given), in decision order."""
    decisions: dict[datetime, list[WindowSummary]] = {}
    for s in summaries:
        decisions.setdefault(s.emitted_at, []).append(s)
    raised: dict[datetime, list[DriftAlert]] = {}
    for a in alerts:
        raised.setdefault(a.raised_at, []).append(a)
    pending = sorted(overrides, key=lambda o: o[0])
    state = LedgerState()
    view = PolicyView()
    for now in sorted(decisions):
        while pending and pending[0][0] <= now:
            at, override = pending.pop(0)
            change, _ = apply_override(state, override, at, cfg.rollout)
            if change is not None:
                view.routing.append(change)
        closed = sorted(decisions[now], key=window_order)
        comparisons = compare_windows(state, closed, now, cfg.compare)
        view.comparisons += comparisons
        policy_models: dict[str, set[str]] = {}
        for s in closed:
            if s.upstream == POLICY:
                policy_models.setdefault(s.agent_name, set()).add(s.model)
        view.routing += decide_rollout(
            state, comparisons, raised.get(now, []), now, cfg.rollout, policy_models
        )
    for at, override in pending:
        change, _ = apply_override(state, override, at, cfg.rollout)
        if change is not None:
            view.routing.append(change)
    return view


async def read_policy(
    reader: TopicReader, topics: Topics, *, inputs: bool = False
) -> tuple[PolicyView, list[WindowSummary], list[DriftAlert]]:
    """What the ledger owner published; with ``inputs``, also the windows and alerts it
    decided from (to recompute)."""
    await reader.refresh()

    async def whole(topic: str, kind: type[Any]) -> list[Any]:
        if not reader.exists(topic):
            return []
        tps = reader.partitions(topic)
        ends = await reader.end_offsets(tps)
        firsts = await reader.beginning_offsets(tps)
        raw = await reader.read({tp: (firsts[tp], ends[tp]) for tp in tps}, stall_s=5.0)
        return reader.decode(raw, kind)

    view = PolicyView(
        await whole(topics.comparisons, Comparison), await whole(topics.routing, RoutingShare)
    )
    windows = await whole(topics.windows, WindowSummary) if inputs else []
    alerts = await whole(topics.alerts, DriftAlert) if inputs else []
    return view, windows, alerts


def _num(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def _version(c: Comparison) -> str:
    if c.policy_version is not None:
        return f"v{c.policy_version}"
    return "several" if c.span == "window" and c.policy_count else "-"


def _fallbacks(c: Comparison) -> str:
    if c.fallback_rate is None:
        return "-"
    return f"{c.policy_fallbacks} + {c.policy_mixed} mixed ({c.fallback_rate:.0%})"


def render(view: PolicyView, console: Any, *, title: str = "") -> None:
    """One table of window comparisons per agent (newest last; a window that several policy
    versions answered is followed by one row per version), the latest trailing one, and the
    routing changes."""
    from rich.table import Table

    agents = sorted({c.agent_name for c in view.comparisons} | {r.agent_name for r in view.routing})
    if not agents:
        console.print(
            "no comparison yet: the gateway routes no call to production, or no "
            "window has closed with both arms"
        )
        return
    for agent in agents:
        rows = [c for c in view.comparisons if c.agent_name == agent and c.span != "trailing"]
        table = Table(title=f"{title}{agent}: policy - production (Welch, {_level(view)})")
        for col in (
            "window",
            "version",
            "policy n",
            "policy mean",
            "fallbacks",
            "production n",
            "production mean",
            "difference",
            "interval",
            "verdict",
        ):
            table.add_column(
                col, justify="left" if col in ("window", "version", "verdict") else "right"
            )
        for c in rows:
            table.add_row(
                c.window_start.strftime("%Y-%m-%d %H:%M:%S") if c.span == "window" else "",
                _version(c),
                str(c.policy_count),
                _num(c.policy_mean),
                _fallbacks(c) if c.span == "window" else "",
                str(c.production_count),
                _num(c.production_mean),
                _num(c.difference, "+.3f"),
                f"[{_num(c.lower, '+.3f')}, {_num(c.upper, '+.3f')}]",
                c.verdict,
            )
        console.print(table)
        trailing = [c for c in view.comparisons if c.agent_name == agent and c.span == "trailing"]
        if trailing:
            t = trailing[-1]
            console.print(
                f"  trailing {t.windows} windows: policy {_num(t.policy_mean)} (n={t.policy_count},"
                f" fallbacks {_fallbacks(t)}) vs production {_num(t.production_mean)} "
                f"(n={t.production_count}): {_num(t.difference, '+.3f')} in "
                f"[{_num(t.lower, '+.3f')}, {_num(t.upper, '+.3f')}] -> {t.verdict}"
            )
        for r in (r for r in view.routing if r.agent_name == agent):
            judged = "" if r.policy_version is None else f" of policy v{r.policy_version}"
            console.print(
                f"  routing v{r.version} {r.action}{judged}: share {r.previous_share:g} -> "
                f"{r.share:g} from {r.effective_at.strftime('%H:%M:%S')}"
                + (f" by {r.requested_by}" if r.requested_by else "")
                + (f" ({r.reason})" if r.reason else "")
            )


def _level(view: PolicyView) -> str:
    levels = {c.level for c in view.comparisons}
    return f"{levels.pop():.0%}" if len(levels) == 1 else "mixed levels"
