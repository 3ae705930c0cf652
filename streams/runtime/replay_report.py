"""How a replay reports: what it did (:class:`ReplayResult`), reward distributions, the A/B
comparison of two reward functions, the progress bar and the summary table.

May import: the standard library, rich, the core, the top-level modules, :mod:`streams.export`,
:mod:`streams.runtime.replay_options` and :mod:`streams.runtime.replay_runner`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.backfill import FeedbackPlan, Outcome
from ..export.dataset import ExportFile
from ..models import LedgerState
from .replay_options import ReplayOptions
from .replay_runner import ReplayRunner

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "Comparison",
    "Distribution",
    "ReplayResult",
    "compare",
    "print_comparison",
    "print_summary",
    "progress",
]


@dataclass(frozen=True)
class Distribution:
    """Count, mean, standard deviation and quantiles of a list of rewards."""

    count: int
    mean: float | None = None
    stdev: float | None = None
    min: float | None = None
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls(0)
        ordered = sorted(values)
        if len(ordered) == 1:
            v = ordered[0]
            return cls(1, v, 0.0, v, v, v, v, v)
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        return cls(
            count=len(ordered),
            mean=statistics.fmean(ordered),
            stdev=statistics.stdev(ordered),
            min=ordered[0],
            p10=deciles[0],
            p50=statistics.median(ordered),
            p90=deciles[-1],
            max=ordered[-1],
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("count", "mean", "stdev", "min", "p10", "p50", "p90", "max")
        }


@dataclass(frozen=True)
class Comparison:
    """Two reward functions over the same trajectories."""

    a: Distribution
    b: Distribution
    both: int
    """Trajectories both scored."""
    pearson: float | None
    agreement: float | None
    """Share of the trajectories both scored on which they agree about ``reward >= threshold``."""
    threshold: float
    only_a: list[str]
    """Calls rewarded (>= threshold) by A and not by B (B below it, or B failed)."""
    only_b: list[str]


def compare(outcomes: Sequence[Outcome], threshold: float, a: int = 0, b: int = 1) -> Comparison:
    """Compare reward functions ``a`` and ``b`` of the outcomes (see :class:`Comparison`)."""
    va = [r.reward for o in outcomes if (r := o.rewards[a]) is not None]
    vb = [r.reward for o in outcomes if (r := o.rewards[b]) is not None]
    pairs = [
        (ra.reward, rb.reward, o.call_id)
        for o in outcomes
        if (ra := o.rewards[a]) is not None and (rb := o.rewards[b]) is not None
    ]
    pearson = None
    if len(pairs) >= 2:
        try:
            pearson = statistics.correlation([p[0] for p in pairs], [p[1] for p in pairs])
        except statistics.StatisticsError:  # one side is constant: no correlation defined
            pearson = None
    agree = sum((x >= threshold) == (y >= threshold) for x, y, _ in pairs)

    def passes(o: Outcome, i: int) -> bool:
        r = o.rewards[i]
        return r is not None and r.reward >= threshold

    scored_any = [o for o in outcomes if o.rewards[a] is not None or o.rewards[b] is not None]
    return Comparison(
        a=Distribution.of(va),
        b=Distribution.of(vb),
        both=len(pairs),
        pearson=pearson,
        agreement=agree / len(pairs) if pairs else None,
        threshold=threshold,
        only_a=[o.call_id for o in scored_any if passes(o, a) and not passes(o, b)],
        only_b=[o.call_id for o in scored_any if passes(o, b) and not passes(o, a)],
    )


def progress(console: Console) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f}/s" if speed else "-/s", style="progress.data.speed")

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        Rate(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )


@dataclass
class ReplayResult:
    """What a replay did, for the summary and for tests."""

    replay_id: str
    core: ReplayRunner
    source: dict[str, Any]
    dry_run: bool
    records: int = 0
    acknowledged_before: int = 0
    uncommitted_before: int = 0
    """Acknowledged by an interrupted run of this replay and not committed: committed now."""
    plan: FeedbackPlan | None = None
    sent: int = 0
    acked: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)
    commits: int = 0
    exports: list[ExportFile] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    redactions: dict[str, Any] | None = None
    comparison: Comparison | None = None
    ledger: LedgerState | None = None
    """This replay's commit ledger as ``<p>.replayed`` had it (None: it never committed)."""


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_summary(console: Console, result: ReplayResult, options: ReplayOptions) -> None:
    """The end-of-replay summary: what was read, decided, scored, sent and written."""
    from rich.table import Table

    core, s = result.core, result.core.stats
    src = result.source
    table = Table(
        title=f"replay {result.replay_id}"
        + (
            (
                " (dry run: nothing sent to Trinity or written"
                + (", but the judge's new verdicts were recorded)" if s["judge.asked"] else ")")
            )
            if result.dry_run
            else ""
        ),
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()
    if src.get("mode") == "time":
        table.add_row(
            "range",
            f"{src['since'] or 'start'} .. {src['until']} "
            f"(read from {src['lookback_s']:g}s earlier for context)",
        )
    else:
        table.add_row("offsets", json.dumps(src.get("topics", {})))
    table.add_row("strategy", core.strategy.name)
    table.add_row("reward", f"{core.rewarders[0].name} (version {core.rewarders[0].version})")
    if any(r.needs_verdict for r in core.rewarders):
        table.add_row(
            "judge verdicts",
            f"{s['judge.verdicts_stored']} read from the verdicts topic, {s['judge.asked']} "
            f"asked, {s['judge.not_asked']} without one (dead letters)",
        )
    table.add_row(
        "records read",
        f"{result.records} ({s['records.event']} events, {s['records.feedback']} feedback)",
    )
    if s["records.invalid"]:
        table.add_row(
            "invalid records",
            f"{s['records.invalid']}: "
            + "; ".join(f"{n}x {why}" for why, n in core.invalid.most_common(3)),
        )
    table.add_row(
        "duplicates / late",
        f"{s['events.duplicate'] + s['feedback.duplicate']} / {s['events.late']}",
    )
    table.add_row(
        "calls closed in range",
        f"{s['calls.closed']} ({s['calls.closed_ended']} "
        f"ended, {s['calls.closed_abandoned']} abandoned, "
        f"{s['calls.closed_oversized']} oversized)"
        + (f"; {s['calls.before_range']} closed before it" if s["calls.before_range"] else ""),
    )
    table.add_row("selected", f"{s['calls.selected']} of {s['calls.closed']}")
    table.add_row(
        "trajectories complete",
        f"{s['calls.selected'] - s['trajectories.incomplete']}"
        + (
            f" ({s['trajectories.incomplete']} abandoned/oversized, not scored)"
            if s["trajectories.incomplete"]
            else ""
        ),
    )
    if core.incomplete:
        more = " ..." if len(core.incomplete) > 5 else ""
        table.add_row(
            "incomplete (open at end)",
            f"{len(core.incomplete)}: " + ", ".join(core.incomplete[:5]) + more,
        )
    table.add_row(
        "rewarded",
        f"{s['rewarded.0']}"
        + (f" ({s['reward_errors.0']} reward errors)" if s["reward_errors.0"] else ""),
    )
    if s["nothing_trainable.0"]:
        table.add_row(
            "nothing trainable",
            f"{s['nothing_trainable.0']} (no LLM step with a response id: no msg_ids to reward)",
        )
    dist = Distribution.of([r.reward for _, r in core.scored()])
    table.add_row(
        "rewards",
        f"mean {_fmt(dist.mean)}  stdev {_fmt(dist.stdev)}  "
        f"p10 {_fmt(dist.p10)}  p50 {_fmt(dist.p50)}  p90 {_fmt(dist.p90)}",
    )
    if s["feedback.unmatched"]:
        table.add_row(
            "user feedback unmatched",
            f"{s['feedback.unmatched']} (calls not selected or not closed in the range)",
        )
    plan = result.plan
    if plan is not None:
        verb = "would send" if result.dry_run else "sent"
        table.add_row(
            "Trinity",
            f"{verb} {len(plan.send) if result.dry_run else result.sent} "
            f"feedback(s)"
            + (
                ""
                if result.dry_run
                else f", {result.acked} acknowledged, {result.commits} commit(s)"
            ),
        )
        if result.uncommitted_before:
            table.add_row(
                "recovered",
                f"{result.uncommitted_before} feedback(s) an interrupted "
                "run got acknowledged but did not commit: committed now",
            )
        if plan.skipped:
            table.add_row(
                "skipped",
                f"{len(plan.skipped)} already acknowledged under replay "
                f"{result.replay_id}: "
                + ", ".join(plan.skipped[:5])
                + (" ..." if len(plan.skipped) > 5 else ""),
            )
        if plan.unsendable:
            table.add_row("not sendable", f"{len(plan.unsendable)}: {plan.unsendable[0][1]}")
        if result.rejected:
            table.add_row("rejected by Trinity", f"{len(result.rejected)}: {result.rejected[0][1]}")
    for f in result.exports:
        where = f" -> {options.out / f.name}" if options.out and not result.dry_run else ""
        table.add_row(
            f.name, f"{len(f.rows)} rows, {f.duplicates_removed} duplicates removed" + where
        )
    for where, summary in (result.redactions or {}).items():
        if summary is not None:
            table.add_row(
                f"redactions ({where.replace('_', ' ')})",
                ", ".join(f"{k} {v}" for k, v in summary["counts"].items()),
            )
    console.print(table)
    if plan is not None and plan.skipped:
        console.print(
            f"skipped {len(plan.skipped)} trajectories already acknowledged under "
            f"replay {result.replay_id}"
        )
    if result.comparison is not None:
        print_comparison(console, result.comparison, core.rewarders[0].name, core.rewarders[1].name)


def print_comparison(console: Console, c: Comparison, name_a: str, name_b: str) -> None:
    """A and B side by side: distributions, correlation, agreement and disagreements."""
    from rich.table import Table

    table = Table(
        title=f"A/B of reward functions (threshold {c.threshold:g})", title_justify="left"
    )
    table.add_column("")
    table.add_column(f"A: {name_a}")
    table.add_column(f"B: {name_b}")
    for key in ("count", "mean", "stdev", "min", "p10", "p50", "p90", "max"):
        va, vb = getattr(c.a, key), getattr(c.b, key)
        table.add_row(
            key, str(va) if key == "count" else _fmt(va), str(vb) if key == "count" else _fmt(vb)
        )
    table.add_row(f">= {c.threshold:g}, not by the other", str(len(c.only_a)), str(len(c.only_b)))
    console.print(table)
    console.print(
        f"scored by both: {c.both}; Pearson correlation: {_fmt(c.pearson)}; "
        f"agreement at {c.threshold:g}: " + ("-" if c.agreement is None else f"{c.agreement:.1%}")
    )
    for label, calls in (("A", c.only_a), ("B", c.only_b)):
        if calls:
            console.print(f"rewarded by {label} only (first 10): " + ", ".join(calls[:10]))
