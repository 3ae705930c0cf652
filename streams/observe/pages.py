"""The status page (``trajstream status --web``): server-rendered HTML, no script, no assets.

``GET /``                  what needs attention, workers and lag, the reward trend per agent and
                           model over the closed windows (an inline SVG), recent calls with their
                           selection decision and reason, commits, dead letters of the last hour
``GET /calls/{call_id}``   one call: its decision, its trajectory's steps (``<p>.trajectories``),
                           its reward and the components that made it (``<p>.rewarded``)
``GET /status.json``       the snapshot of ``trajstream status --json``

Everything is read from the topics on each request, with one :class:`TopicReader` kept open.
The page renders are pure functions of the records (:func:`index_html`, :func:`call_html`,
:func:`trend_svg`), tested without Kafka.

May import aiohttp, aiokafka (through :mod:`.status`), the package's models and settings,
:func:`streams.core.ledger.pool_versions`.
"""

from __future__ import annotations

import asyncio
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiokafka import TopicPartition
from aiokafka.partitioner import murmur2

from ..core.ledger import pool_versions
from ..models import (
    CommitRecord,
    Comparison,
    DeadLetter,
    RewardedTrajectory,
    RoutingShare,
    SelectionDecision,
    Trajectory,
    WindowSummary,
    utcnow,
)
from ..settings import Settings
from ..topics import Topics
from .compare_page import compare_html
from .status import Status, TopicReader, collect
from .web import bind_socket

__all__ = ["StatusPages", "call_html", "index_html", "serve_pages", "trend_svg"]

RECENT_CALLS = 50
TREND_HOURS = 6.0
SEARCH_BACK = timedelta(minutes=2)  # a call's records are written right after its decision
SEARCH_LIMIT = 20_000

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#111;background:#f6f7f9}
header{background:#111827;color:#fff;padding:10px 20px}header a{color:#fff}
main{padding:12px 20px;max-width:1200px}
h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;width:100%;font-size:13px}
th,td{border:1px solid #e5e7eb;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f4f6}
.sel{color:#15803d;font-weight:600}.rej{color:#6b7280}
.hint{border-left:4px solid #f59e0b;background:#fffbeb;padding:6px 10px;margin:4px 0}
.hint.error{border-color:#dc2626;background:#fef2f2}.hint.info{border-color:#0891b2;background:#ecfeff}
.ok{border-left:4px solid #16a34a;background:#f0fdf4;padding:6px 10px}
.muted{color:#6b7280}pre{white-space:pre-wrap;margin:0;font-size:12px}
svg{background:#fff;border:1px solid #e5e7eb}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _commit_result(c: CommitRecord) -> str:
    return "sent" if c.sent else "held (reward drop)" if c.held else "not sent (nothing ready)"


def _t(value: datetime | None) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M:%S}"


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f'<header><a href="/">trajstream</a> · {_e(title)}</header><main>{body}</main>'
        "</body></html>"
    )


# -- the reward trend --------------------------------------------------------------------------


def trend_svg(windows: Sequence[WindowSummary], width: int = 900, height: int = 260) -> str:
    """Mean reward per closed window, one line per agent and model, as an inline SVG.

    Every window is a circle carrying ``data-agent``, ``data-model``, ``data-window-start``
    (ISO 8601) and ``data-mean``, with a tooltip. The policy's windows, kept per version, are
    drawn with their versions pooled (one point per window).
    """
    windows = pool_versions(list(windows))
    if not windows:
        return '<p class="muted" id="trend-empty">no closed reward windows yet</p>'
    left, right, top, bottom = 48, 16, 12, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    t0 = min(w.window_start for w in windows).timestamp()
    t1 = max(w.window_start for w in windows).timestamp()
    lo = min(0.0, min(w.mean for w in windows))
    hi = max(1.0, max(w.mean for w in windows))
    span_t = (t1 - t0) or 1.0
    span_v = (hi - lo) or 1.0

    def x(w: WindowSummary) -> float:
        if t1 == t0:
            return left + plot_w / 2
        return left + (w.window_start.timestamp() - t0) / span_t * plot_w

    def y(v: float) -> float:
        return top + (1 - (v - lo) / span_v) * plot_h

    series: dict[tuple[str, str], list[WindowSummary]] = {}
    for w in sorted(windows, key=lambda w: w.window_start):
        series.setdefault((w.agent_name, w.model), []).append(w)
    parts = [
        f'<svg id="trend" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height + 20 * math.ceil(len(series) / 3)}" role="img" '
        'aria-label="mean reward per window">'
    ]
    for v in (lo, (lo + hi) / 2, hi):
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            'stroke="#e5e7eb"/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">'
            f"{v:.2g}</text>"
        )
    first, last = (
        min(windows, key=lambda w: w.window_start),
        max(windows, key=lambda w: w.window_start),
    )
    parts.append(
        f'<text x="{left}" y="{top + plot_h + 16}" font-size="11">'
        f"{first.window_start:%H:%M:%S}</text>"
        f'<text x="{left + plot_w}" y="{top + plot_h + 16}" font-size="11" '
        f'text-anchor="end">{last.window_start:%H:%M:%S} UTC</text>'
    )
    for i, ((agent, model), points) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{x(w):.1f},{y(w.mean):.1f}" for w in points)
        parts.append(
            f'<polyline class="series" data-agent="{_e(agent)}" data-model="{_e(model)}" '
            f'points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>'
        )
        for w in points:
            parts.append(
                f'<circle class="window" cx="{x(w):.1f}" cy="{y(w.mean):.1f}" r="3.5" '
                f'fill="{color}" data-agent="{_e(agent)}" data-model="{_e(model)}" '
                f'data-window-start="{w.window_start.isoformat()}" data-mean="{w.mean:.6g}">'
                f"<title>{_e(agent)} / {_e(model)} {w.window_start:%H:%M:%S}: mean "
                f"{w.mean:.3f} over {w.count}</title></circle>"
            )
        lx, ly = left + (i % 3) * (plot_w / 3), height + 20 * (i // 3) + 4
        parts.append(
            f'<rect x="{lx:.0f}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
            f'<text x="{lx + 14:.0f}" y="{ly}" font-size="12">{_e(agent)} / {_e(model)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


# -- pages -------------------------------------------------------------------------------------


@dataclass
class DecisionRow:
    decision: SelectionDecision
    partition: int
    timestamp_ms: int


def _call_link(row: DecisionRow) -> str:
    d = row.decision
    href = f"/calls/{quote(d.call_id, safe='')}?p={row.partition}&t={row.timestamp_ms}"
    return f'<a class="call" href="{_e(href)}">{_e(d.call_id)}</a>'


def _hints_html(status: Status) -> str:
    if not status.hints:
        return '<div class="ok">nothing needs attention</div>'
    return "".join(
        f'<div class="hint {_e(h.level)}"><b>{_e(h.what)}</b><br>'
        f'<span class="muted">→ {_e(h.do)}</span></div>'
        for h in status.hints
    )


def index_html(
    status: Status,
    decisions: Sequence[DecisionRow],
    windows: Sequence[WindowSummary],
    commits: Sequence[CommitRecord],
    dead_letters: Sequence[DeadLetter],
    trend_hours: float = TREND_HOURS,
    comparisons: Sequence[Comparison] = (),
    routing: Sequence[RoutingShare] = (),
) -> str:
    workers = "".join(
        f"<tr><td>{_e(m.client_id)}</td><td>{_e(m.host)}</td><td>"
        + _e(
            ", ".join(
                f"{t.removeprefix(status.prefix + '.')}: {','.join(map(str, ps))}"
                for t, ps in sorted(m.partitions.items())
                if t.startswith(status.prefix + ".")
            )
        )
        + "</td></tr>"
        for m in status.members
    )
    lag = "".join(f"<tr><td>{_e(t.topic)}</td><td>{t.lag}</td></tr>" for t in status.lag if t.lag)
    calls = "".join(
        f"<tr><td>{_t(r.decision.decided_at)}</td><td>{_call_link(r)}</td>"
        f"<td>{_e(r.decision.agent_name or '-')}</td><td>{_e(r.decision.model or '-')}</td>"
        f'<td class="{"sel" if r.decision.selection.selected else "rej"}">'
        f"{'selected' if r.decision.selection.selected else 'rejected'}</td>"
        f"<td>{_e(r.decision.selection.reason)}</td><td>{_e(r.decision.selection.strategy)}</td>"
        f"<td>{_e(r.decision.closed_reason)}</td><td>{r.decision.steps}</td></tr>"
        for r in sorted(decisions, key=lambda r: r.timestamp_ms, reverse=True)
    )
    commit_rows = "".join(
        f"<tr><td>{c.commit_seq}</td><td>{_t(c.interval_end)}</td><td>{c.feedback_count}</td>"
        f"<td>{'-' if c.reward_mean is None else f'{c.reward_mean:.3f}'}</td>"
        f"<td>{_commit_result(c)}</td>"
        f"<td>{'-' if c.experiences is None else c.experiences}</td></tr>"
        for c in reversed(commits)
    )
    letters = "".join(
        f"<tr><td>{_t(d.failed_at)}</td><td>{_e(d.stage)}</td>"
        f"<td>{_e(d.source_topic)}[{d.source_partition}]@{d.source_offset}</td>"
        f"<td>{_e(d.error_type)}</td><td>{_e(d.reason)}</td></tr>"
        for d in reversed(dead_letters)
    )
    opened = "unknown" if status.open_calls is None else str(status.open_calls)

    def table(head: str, rows: str, empty: str, ident: str) -> str:
        if not rows:
            return f'<p class="muted" id="{ident}-empty">{empty}</p>'
        cols = "".join(f"<th>{h}</th>" for h in head.split("|"))
        return f'<table id="{ident}"><tr>{cols}</tr>{rows}</table>'

    body = (
        f"<p>deployment <b>{_e(status.prefix)}</b>, group <b>{_e(status.group)}</b> "
        f"({_e(status.group_state)}), {len(status.members)} worker(s), open calls "
        f"<b>{opened}</b>, lag <b>{status.total_lag}</b> records · {_t(status.at)} UTC</p>"
        + _hints_html(status)
        + f"<h2>Reward trend (mean per window, last {trend_hours:g} h)</h2>"
        + trend_svg(windows)
        + "<h2>Policy against production</h2>"
        + compare_html(comparisons, routing)
        + "<h2>Recent calls</h2>"
        + table(
            "decided|call|agent|model|decision|reason|strategy|closed|steps",
            calls,
            "no decisions yet",
            "calls",
        )
        + "<h2>Commits</h2>"
        + table(
            "seq|at|feedbacks|mean reward|result|experiences", commit_rows, "none yet", "commits"
        )
        + "<h2>Dead letters (last hour)</h2>"
        + table("at|stage|source|error|reason", letters, "none", "dead-letters")
        + "<h2>Workers</h2>"
        + table("worker|host|partitions", workers, "no workers in the group", "workers")
        + "<h2>Lag</h2>"
        + table("topic|records", lag, "no lag", "lag")
    )
    return _page(f"status of {status.prefix}", body)


def call_html(
    call_id: str,
    decision: SelectionDecision | None,
    trajectory: Trajectory | None,
    rewarded: RewardedTrajectory | None,
) -> str:
    parts = [f"<h2>Call <code>{_e(call_id)}</code></h2>"]
    if decision is None:
        parts.append('<p class="muted" id="no-decision">no decision found for this call</p>')
    else:
        s = decision.selection
        parts.append(
            f'<p id="decision">{_e(decision.agent_name or "-")} / {_e(decision.model or "-")}: '
            f'<span class="{"sel" if s.selected else "rej"}">'
            f"{'selected' if s.selected else 'rejected'}</span> by <code>{_e(s.strategy)}</code>"
            f" ({_e(s.reason)}); closed {_e(decision.closed_reason)} at "
            f"{_t(decision.decided_at)}, {decision.steps} steps</p>"
        )
    if rewarded is None:
        parts.append('<p class="muted" id="no-reward">no reward (not selected, or not yet)</p>')
    else:
        comps = "".join(
            f"<tr><td>{_e(k)}</td><td>{v:.4g}</td></tr>"
            for k, v in sorted(rewarded.components.items())
        )
        parts.append(
            f'<h2>Reward <span id="reward">{rewarded.reward:.4g}</span></h2>'
            f"<p>{_e(rewarded.reward_fn)} (version {_e(rewarded.reward_version)}), "
            f"{'succeeded' if rewarded.succeeded else 'failed'}, task "
            f"<code>{_e(rewarded.task_id)}</code>, msg_ids {len(rewarded.msg_ids)}</p>"
            + (
                f'<table id="components"><tr><th>component</th><th>value</th></tr>{comps}</table>'
                if comps
                else '<p class="muted">no components</p>'
            )
        )
    if trajectory is None:
        parts.append('<p class="muted" id="no-trajectory">no trajectory (not selected)</p>')
    else:
        rows = []
        for step in trajectory.steps:
            inputs = "\n".join(f"{m.role}: {m.content}" for m in step.input_messages)
            outputs = "\n".join(f"{m.role}: {m.content}" for m in step.output_messages)
            what = step.tool_name or step.response_model or step.request_model or ""
            rows.append(
                f'<tr class="step" data-seq="{step.seq}"><td>{step.seq}</td>'
                f"<td>{_e(step.kind.value)}</td><td>{_e(what)}</td>"
                f"<td>{_e(step.response_id or '-')}</td>"
                f"<td><pre>{_e(inputs[-1500:])}</pre></td><td><pre>{_e(outputs[:1500])}</pre></td>"
                f"<td>{'-' if step.latency_ms is None else f'{step.latency_ms:.0f} ms'}</td></tr>"
            )
        feedback = "".join(
            f"<li>{_e(f.kind.value)} {_e(f.rating if f.rating is not None else '')}"
            f"{_e(f.thumbs_up if f.thumbs_up is not None else '')} {_e(f.comment or '')}</li>"
            for f in trajectory.feedback
        )
        parts.append(
            f"<h2>Trajectory ({len(trajectory.steps)} steps)</h2>"
            f"<p>status {_e(trajectory.status.value if trajectory.status else '-')}, "
            f"{_t(trajectory.started_at)} → {_t(trajectory.ended_at)}</p>"
            f"<p><b>input</b></p><pre>"
            + _e("\n".join(f"{m.role}: {m.content}" for m in trajectory.input_messages)[-2000:])
            + f"</pre><p><b>output</b></p><pre>{_e((trajectory.output or '')[:2000])}</pre>"
            + '<table id="steps"><tr><th>seq</th><th>kind</th><th>model / tool</th>'
            "<th>response id</th><th>input</th><th>output</th><th>latency</th></tr>"
            + "".join(rows)
            + "</table>"
            + (f"<h2>User feedback</h2><ul>{feedback}</ul>" if feedback else "")
        )
    return _page(f"call {call_id}", "".join(parts))


# -- the server --------------------------------------------------------------------------------


class StatusPages:
    """The page's routes, reading with one TopicReader (opened on first use)."""

    def __init__(self, settings: Settings, bootstrap: str) -> None:
        self.settings = settings
        self.bootstrap = bootstrap
        self.topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
        self._reader: TopicReader | None = None
        self._lock = asyncio.Lock()

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/", self._index)
        app.router.add_get("/calls/{call_id}", self._call)
        app.router.add_get("/status.json", self._json)
        app.on_cleanup.append(self._close)

    async def _open(self) -> TopicReader:
        if self._reader is None:
            reader = TopicReader(self.bootstrap, security=self.settings.kafka.security)
            self._reader = await reader.__aenter__()
        await self._reader.refresh()
        return self._reader

    async def _close(self, app: web.Application) -> None:
        if self._reader is not None:
            await self._reader.aclose()
            self._reader = None

    async def _index(self, request: web.Request) -> web.Response:
        """The status page (HTML): the status snapshot, recent calls, the reward trend over
        ``?hours=``."""
        hours = float(request.query.get("hours", TREND_HOURS))
        async with self._lock:
            r = await self._open()
            status = await collect(self.settings, self.bootstrap, sample_gap_s=0, reader=r)
            t = self.topics
            raw = await r.tail(t.decisions, RECENT_CALLS) if r.exists(t.decisions) else []
            decisions = [
                DecisionRow(d, m.partition, m.timestamp)
                for m in raw[-RECENT_CALLS:]
                for d in r.decode([m], SelectionDecision)
            ]
            since = utcnow() - timedelta(hours=hours)
            windows = (
                r.decode(await r.since(t.windows, since, limit=5000), WindowSummary)
                if r.exists(t.windows)
                else []
            )
            commits = r.decode(await r.tail(t.commits, 20), CommitRecord)
            letters = r.decode(
                await r.since(t.dead_letters, utcnow() - timedelta(hours=1), limit=20),
                DeadLetter,
            )
            compared = (
                r.decode(await r.since(t.comparisons, since, limit=5000), Comparison)
                if r.exists(t.comparisons)
                else []
            )
            routing = (
                r.decode(await r.tail(t.routing, 200), RoutingShare) if r.exists(t.routing) else []
            )
        page = index_html(
            status, decisions, windows, commits, letters[-20:], hours, compared, routing
        )
        return web.Response(text=page, content_type="text/html")

    async def _call(self, request: web.Request) -> web.Response:
        """One call's page (HTML): its trajectory, steps and user feedback (``?p=`` partition,
        ``?t=`` time in ms narrow the search)."""
        call_id = request.match_info["call_id"]
        key = call_id.encode()
        n = self.settings.kafka.partitions
        try:
            partition = int(request.query["p"])
        except (KeyError, ValueError):
            partition = (murmur2(key) & 0x7FFFFFFF) % n  # the producers' default partitioner
        try:
            at = datetime.fromtimestamp(int(request.query["t"]) / 1000, tz=utcnow().tzinfo)
            start = at - SEARCH_BACK
        except (KeyError, ValueError, OverflowError):
            start = utcnow() - timedelta(hours=1)
        t = self.topics
        async with self._lock:
            r = await self._open()
            found = {}
            for topic, kind in (
                (t.decisions, SelectionDecision),
                (t.trajectories, Trajectory),
                (t.rewarded, RewardedTrajectory),
            ):
                found[topic] = await _find(r, topic, partition, key, start, kind)
        page = call_html(call_id, found[t.decisions], found[t.trajectories], found[t.rewarded])
        return web.Response(text=page, content_type="text/html")

    async def _json(self, request: web.Request) -> web.Response:
        """The status snapshot as JSON (what ``trajstream status --json`` prints)."""
        async with self._lock:
            r = await self._open()
            status = await collect(self.settings, self.bootstrap, sample_gap_s=0, reader=r)
        return web.json_response(status.to_json())


async def _find(
    r: TopicReader, topic: str, partition: int, key: bytes, start: datetime, kind: type[Any]
) -> Any:
    """The first record with ``key`` on one partition from ``start`` on (bounded scan)."""
    if not r.exists(topic):
        return None
    tp = TopicPartition(topic, partition)
    ends = await r.end_offsets([tp])
    begin = (await r.offsets_at([tp], start, ends))[tp]
    messages = await r.read({tp: (begin, min(ends[tp], begin + SEARCH_LIMIT))})
    for m in messages:
        if m.key == key:
            decoded = r.decode([m], kind)
            if decoded:
                return decoded[0]
    return None


def application(settings: Settings, bootstrap: str) -> web.Application:
    app = web.Application()
    StatusPages(settings, bootstrap).routes(app)
    return app


def serve_pages(settings: Settings, bootstrap: str, host: str, port: int) -> None:
    """Serve the status page until interrupted (``trajstream status --web``)."""
    sock = bind_socket(host, port, setting=f"trajstream status --web --port {port}")
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    print(f"status page on http://{shown}:{sock.getsockname()[1]}/ (Ctrl-C to stop)", flush=True)
    web.run_app(application(settings, bootstrap), sock=sock, print=None, access_log=None)
