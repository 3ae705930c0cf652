"""The status page's "policy against production" section: per agent, both arms' mean reward per
window and the difference with its confidence band, as inline SVG (tested without Kafka).

Each agent is one chart: the policy's and production's window means (two lines, 0..1 and
beyond), and below them the difference policy - production with its interval as a shaded band
around a zero line. Every window is a circle with ``data-agent``, ``data-arm``,
``data-window-start``, ``data-mean``; every band point carries ``data-lower``/``data-upper``.

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
            parts.append(
                f'<circle class="diff" cx="{x(c):.1f}" cy="{yd(c.difference or 0):.1f}" r="3" '
                f'fill="#059669" data-window-start="{c.window_start.isoformat()}" '
                f'data-lower="{c.lower:.6g}" data-upper="{c.upper:.6g}" data-verdict="{c.verdict}">'
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
    latest: dict[tuple[str, object], Comparison] = {}
    for c in comparisons:
        if c.span == "window":
            key = (c.agent_name, c.window_start)
            if key not in latest or c.emitted_at >= latest[key].emitted_at:
                latest[key] = c
    windows = sorted(latest.values(), key=lambda c: c.window_start)
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
        out.append(
            f"<h3>{_e(agent)}</h3><p>latest window: policy "
            f"{'-' if last.policy_mean is None else f'{last.policy_mean:.3f}'} "
            f"(n={last.policy_count}) vs production "
            f"{'-' if last.production_mean is None else f'{last.production_mean:.3f}'} "
            f"(n={last.production_count}): <b>{_e(last.verdict)}</b> "
            f"(Welch, {last.level:.0%})</p>" + _chart(agent, rows)
        )
        changes = [r for r in routing if r.agent_name == agent]
        if changes:
            items = "".join(
                f'<li class="routing" data-action="{_e(r.action)}" data-share="{r.share:g}">'
                f"{r.decided_at:%H:%M:%S} v{r.version} {_e(r.action)}: share "
                f"{r.previous_share:g} → {r.share:g} {_e(r.reason)}</li>"
                for r in sorted(changes, key=lambda r: r.version)
            )
            out.append(f"<ul>{items}</ul>")
    return "".join(out)
