"""The status page's "policy against production" section: per agent, both arms' mean reward per
window and the difference with its confidence band, as inline SVG (tested without Kafka).

Each agent is one chart: the policy's and production's window means (two lines, 0..1 and
beyond), and below them the difference policy - production with its interval as a shaded band
around a zero line. Every window is a circle with ``data-agent``, ``data-arm``,
``data-window-start``, ``data-mean``; every band point carries ``data-lower``/``data-upper``
and ``data-policy-version`` (the one version that answered the window, empty for several).
Beside the chart: the calls routed to the policy that fell back to production, and a table of
the comparisons per policy version (the newest versions first; ``data-policy-version``).

May import: the standard library, :mod:`streams.models`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from ..models import Comparison, RoutingShare

__all__ = ["compare_html"]

ARMS = (("policy", "#2563eb"), ("production", "#f97316"))


def _e(v: object) -> str:
    return html.escape(str(v), quote=True)


def _chart(agent: str, rows: list[Comparison], width: int = 900, height: int = 220) -> str:
    left, right, top = 56, 16, 12
    plot_w = width - left - right
    means_h, diff_h, gap = 110, 70, 26
    t0, t1 = rows[0].window_start.timestamp(), rows[-1].window_start.timestamp()
    span_t = (t1 - t0) or 1.0

    def x(c: Comparison) -> float:
        return left + (
            plot_w / 2 if t1 == t0 else (c.window_start.timestamp() - t0) / span_t * plot_w
        )

    means = [v for c in rows for v in (c.policy_mean, c.production_mean) if v is not None]
    lo, hi = min([0.0, *means]), max([1.0, *means])

    def y(v: float) -> float:
        return top + (1 - (v - lo) / ((hi - lo) or 1.0)) * means_h

    bands = [c for c in rows if c.lower is not None and c.upper is not None]
    d_lo = min([0.0, *(c.lower for c in bands if c.lower is not None)])
    d_hi = max([0.0, *(c.upper for c in bands if c.upper is not None)])
    d_top = top + means_h + gap

    def yd(v: float) -> float:
        return d_top + (1 - (v - d_lo) / ((d_hi - d_lo) or 1.0)) * diff_h

    parts = [
        f'<svg class="compare" data-agent="{_e(agent)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{width}" height="{height + 40}" role="img" '
        f'aria-label="policy and production mean reward of {_e(agent)}">'
        f'<text x="{left - 6}" y="{y(hi) + 4:.1f}" font-size="11" text-anchor="end">{hi:.2g}</text>'
        f'<text x="{left - 6}" y="{y(lo) + 4:.1f}" font-size="11" text-anchor="end">{lo:.2g}</text>'
        f'<line x1="{left}" x2="{left + plot_w}" y1="{yd(0):.1f}" y2="{yd(0):.1f}" '
        'stroke="#9ca3af" stroke-dasharray="4 3"/>'
        f'<text x="{left - 6}" y="{yd(0) + 4:.1f}" font-size="11" text-anchor="end">0</text>'
        f'<text x="{left}" y="{d_top - 6}" font-size="11">difference policy - production, '
        f"with its interval</text>"
    ]
    if bands:
        upper = " ".join(f"{x(c):.1f},{yd(c.upper or 0):.1f}" for c in bands)
        lower = " ".join(f"{x(c):.1f},{yd(c.lower or 0):.1f}" for c in reversed(bands))
        parts.append(
            f'<polygon class="band" points="{upper} {lower}" fill="#a7f3d0" opacity="0.6"/>'
        )
        diff = " ".join(f"{x(c):.1f},{yd(c.difference or 0):.1f}" for c in bands)
        parts.append(
            f'<polyline class="difference" points="{diff}" fill="none" stroke="#059669" '
            'stroke-width="2"/>'
        )
        for c in bands:
            version = "" if c.policy_version is None else str(c.policy_version)
            parts.append(
                f'<circle class="diff" cx="{x(c):.1f}" cy="{yd(c.difference or 0):.1f}" r="3" '
                f'fill="#059669" data-window-start="{c.window_start.isoformat()}" '
                f'data-lower="{c.lower:.6g}" data-upper="{c.upper:.6g}" data-verdict="{c.verdict}" '
                f'data-policy-version="{version}">'
                f"<title>{c.window_start:%H:%M:%S}: {c.difference:+.3f} in [{c.lower:+.3f}, "
                f"{c.upper:+.3f}] ({c.verdict})</title></circle>"
            )
    for i, (arm, color) in enumerate(ARMS):
        points = [(c, getattr(c, f"{arm}_mean"), getattr(c, f"{arm}_count")) for c in rows]
        points = [(c, m, n) for c, m, n in points if m is not None]
        coords = " ".join(f"{x(c):.1f},{y(m):.1f}" for c, m, _ in points)
        parts.append(
            f'<polyline class="arm" data-arm="{arm}" points="{coords}" fill="none" '
            f'stroke="{color}" stroke-width="2"/>'
        )
        for c, m, n in points:
            parts.append(
                f'<circle class="window" cx="{x(c):.1f}" cy="{y(m):.1f}" r="3.5" fill="{color}" '
                f'data-agent="{_e(agent)}" data-arm="{arm}" '
                f'data-window-start="{c.window_start.isoformat()}" data-mean="{m:.6g}">'
                f"<title>{arm} {c.window_start:%H:%M:%S}: mean {m:.3f} over {n}</title></circle>"
            )
        lx = left + i * 160
        parts.append(
            f'<rect x="{lx}" y="{height + 22}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14}" y="{height + 31}" font-size="12">{arm}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def compare_html(comparisons: Sequence[Comparison], routing: Sequence[RoutingShare]) -> str:
    """The section: one chart per agent (window comparisons), the routing changes below it."""
    # a window or a routing change written again (a redelivery after a worker was killed, or a
    # replay) is shown once: the last emitted comparison of a window, the first record of a version
    latest: dict[tuple[str, str, object, int | None], Comparison] = {}
    for c in comparisons:
        if c.span != "trailing":
            key = (c.agent_name, c.span, c.window_start, c.policy_version)
            if key not in latest or c.emitted_at >= latest[key].emitted_at:
                latest[key] = c
    windows = sorted(
        (c for c in latest.values() if c.span == "window"), key=lambda c: c.window_start
    )
    versioned = [c for c in latest.values() if c.policy_version is not None]
    versions: dict[tuple[str, int], RoutingShare] = {}
    for r in routing:
        versions.setdefault((r.agent_name, r.version), r)
    routing = list(versions.values())
    if not windows:
        return (
            '<p class="muted" id="compare-empty">no comparison yet (the gateway routed no call '
            "to production, or no window closed with both arms)</p>"
        )
    out = []
    for agent in sorted({c.agent_name for c in windows}):
        rows = [c for c in windows if c.agent_name == agent]
        last = rows[-1]
        version = "" if last.policy_version is None else f" v{last.policy_version}"
        out.append(
            f"<h3>{_e(agent)}</h3><p>latest window: policy{version} "
            f"{'-' if last.policy_mean is None else f'{last.policy_mean:.3f}'} "
            f"(n={last.policy_count}) vs production "
            f"{'-' if last.production_mean is None else f'{last.production_mean:.3f}'} "
            f"(n={last.production_count}): <b>{_e(last.verdict)}</b> "
            f"(Welch, {last.level:.0%})</p>"
            + _fallbacks(agent, rows)
            + _chart(agent, rows)
            + _versions(agent, [c for c in versioned if c.agent_name == agent])
        )
        changes = [r for r in routing if r.agent_name == agent]
        if changes:
            items = "".join(
                f'<li class="routing" data-action="{_e(r.action)}" data-share="{r.share:g}" '
                f'data-policy-version="{"" if r.policy_version is None else r.policy_version}">'
                f"{r.decided_at:%H:%M:%S} v{r.version} {_e(r.action)}"
                f"{'' if r.policy_version is None else f' (policy v{r.policy_version})'}: share "
                f"{r.previous_share:g} → {r.share:g} {_e(r.reason)}</li>"
                for r in sorted(changes, key=lambda r: r.version)
            )
            out.append(f"<ul>{items}</ul>")
    return "".join(out)


def _fallbacks(agent: str, rows: list[Comparison]) -> str:
    """The calls routed to the policy in the windows shown, and how many fell back."""
    falls = sum(c.policy_fallbacks for c in rows)
    mixed = sum(c.policy_mixed for c in rows)
    routed = sum(c.policy_count for c in rows) + falls + mixed
    if not routed:
        return ""
    return (
        f'<p class="fallbacks" data-agent="{_e(agent)}" data-routed="{routed}" '
        f'data-fallbacks="{falls}" data-mixed="{mixed}">calls routed to the policy: {routed}, '
        f"of which production answered {falls} (fallback) and {mixed} in part (mixed): "
        f"{(falls + mixed) / routed:.1%}, in neither arm's mean</p>"
    )


VERSION_ROWS = 12
"""Comparisons per policy version shown per agent (the newest)."""


def _versions(agent: str, rows: list[Comparison]) -> str:
    """The newest comparisons that name a policy version: a window one version answered, or
    one version's comparison of a window several answered."""
    if not rows:
        return ""
    newest = sorted(rows, key=lambda c: (c.window_start, c.policy_version or 0), reverse=True)
    cells = "".join(
        f'<tr class="version" data-policy-version="{c.policy_version}" '
        f'data-window-start="{c.window_start.isoformat()}" data-verdict="{_e(c.verdict)}">'
        f"<td>v{c.policy_version}</td><td>{c.window_start:%H:%M:%S}</td>"
        f"<td>{c.policy_count}</td>"
        f"<td>{'-' if c.policy_mean is None else f'{c.policy_mean:.3f}'}</td>"
        f"<td>{'-' if c.difference is None else f'{c.difference:+.3f}'}</td>"
        f"<td>{'-' if c.lower is None else f'[{c.lower:+.3f}, {c.upper:+.3f}]'}</td>"
        f"<td>{_e(c.verdict)}</td></tr>"
        for c in newest[:VERSION_ROWS]
    )
    return (
        f'<table class="versions" data-agent="{_e(agent)}"><tr><th>policy version</th>'
        "<th>window</th><th>policy n</th><th>policy mean</th><th>difference</th>"
        f"<th>interval</th><th>verdict</th></tr>{cells}</table>"
    )
