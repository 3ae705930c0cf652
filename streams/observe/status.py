"""``trajstream status``: one snapshot of a deployment, read from its topics and consumer group.

What is read, and from where (nothing is written, no consumer group is joined):

- workers and their partitions: the group's members (DescribeGroups; Faust's assignment is the
  standard consumer protocol's);
- lag per topic: the group's committed offsets (OffsetFetch) against the end offsets, read twice
  ``sample_gap_s`` apart, so that a growing lag and stalled commits can be told;
- open calls: calls with events on ``<p>.agent-events`` in the last ``assembly.abandon_after_s``
  (+1 min) and no record on ``<p>.decisions``, ``<p>.late-events`` or ``<p>.dead-letters``
  since: open at a worker, or not read yet. Only record keys are read (every record is keyed
  by its call_id);
- the last commits (``<p>.commits``), dead letters, late events and drift alerts of the last
  hour (``<p>.dead-letters``, ``<p>.late-events``, ``<p>.alerts``);
- the comparisons of the last hour (``<p>.comparisons``): the newest per agent and span, and
  per agent the calls routed to the policy that fell back to production (whole or mixed).

:func:`collect` does the reading (with :class:`~streams.observe.reader.TopicReader`, also what
the status page reads with), :func:`~streams.observe.snapshot.hints` is the pure judgement of
what needs attention (:mod:`streams.observe.snapshot`, with the snapshot's classes),
:func:`render` prints one screen with rich, :meth:`Status.to_json` is ``--json``. Every name is
re-exported here.

May import aiokafka, rich, the package's models, codec, settings, topics and errors, and
:mod:`streams.io.kafka` (the one range reader).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from aiokafka import TopicPartition

from ..errors import ConfigError
from ..models import CommitRecord, Comparison, DeadLetter, DriftAlert, RoutingShare, utcnow
from ..settings import Settings
from ..topics import Topics
from .reader import TopicReader, input_topics
from .snapshot import Hint, Member, PolicyFallbacks, Status, TopicLag, fallbacks_of, hints

__all__ = [
    "Hint",
    "Member",
    "PolicyFallbacks",
    "Status",
    "TopicLag",
    "TopicReader",
    "collect",
    "hints",
    "input_topics",
    "render",
]


RECENT = timedelta(hours=1)

STALL = 2  # records a partition must hold, uncommitted, at both samples to count as stalled

OPEN_CALL_SCAN_LIMIT = 200_000  # records per topic; past this the count is not given


async def collect(
    settings: Settings,
    bootstrap: str,
    *,
    sample_gap_s: float = 2.0,
    now: datetime | None = None,
    reader: TopicReader | None = None,
) -> Status:
    """Read one snapshot of the deployment named by ``settings`` (prefix, app_id)."""
    if reader is None:
        async with TopicReader(bootstrap, security=settings.kafka.security) as own:
            return await collect(
                settings, bootstrap, sample_gap_s=sample_gap_s, now=now, reader=own
            )
    r = reader
    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    await r.refresh()
    if not r.exists(topics.agent_events):
        raise ConfigError(
            f"topic {topics.agent_events} does not exist: no deployment with "
            f"kafka.topic_prefix={settings.kafka.topic_prefix!r} on {bootstrap}"
        )
    await r.warm(topics.all())
    now = now or utcnow()
    recent_from = now - RECENT
    group_id = settings.app_id
    state, members = await r.group(group_id)

    inputs = [tp for t in input_topics(topics) for tp in r.partitions(t)]
    firsts = await r.beginning_offsets(inputs)
    committed_1 = await r.committed(group_id)
    ends_1 = await r.end_offsets(inputs)
    if sample_gap_s > 0:
        await asyncio.sleep(sample_gap_s)
        committed_2 = await r.committed(group_id)
        ends_2 = await r.end_offsets(inputs)
    else:
        committed_2, ends_2 = committed_1, ends_1

    def lag(ends: dict[TopicPartition, int], committed: dict[TopicPartition, int], tp: Any) -> int:
        return max(0, ends[tp] - committed.get(tp, firsts[tp]))

    lags = []
    for topic in input_topics(topics):
        tps = r.partitions(topic)
        lags.append(
            TopicLag(
                topic=topic,
                lag=sum(lag(ends_2, committed_2, tp) for tp in tps),
                lag_before=sum(lag(ends_1, committed_1, tp) for tp in tps),
                partitions={tp.partition: lag(ends_2, committed_2, tp) for tp in tps},
                committed_moved=any(committed_1.get(tp) != committed_2.get(tp) for tp in tps),
                stalled=[
                    tp.partition
                    for tp in tps
                    if committed_1.get(tp) == committed_2.get(tp)
                    and min(lag(ends_1, committed_1, tp), lag(ends_2, committed_2, tp)) >= STALL
                ],
            )
        )

    commit_msgs = await r.tail(topics.commits, 5) if r.exists(topics.commits) else []
    commits = r.decode(commit_msgs, CommitRecord)
    last_commit_at = (
        datetime.fromtimestamp(commit_msgs[-1].timestamp / 1000, tz=now.tzinfo)
        if commit_msgs
        else None
    )
    rewarded_since, oldest = await _rewarded_since(r, topics.rewarded, last_commit_at)

    letters_raw = (
        await r.since(topics.dead_letters, recent_from) if r.exists(topics.dead_letters) else []
    )
    letters = r.decode(letters_raw, DeadLetter)
    alerts = (
        r.decode(await r.since(topics.alerts, recent_from), DriftAlert)
        if r.exists(topics.alerts)
        else []
    )
    compared = (
        r.decode(await r.since(topics.comparisons, recent_from), Comparison)
        if r.exists(topics.comparisons)
        else []
    )
    newest_cmp = {(c.agent_name, c.span): c for c in compared if c.span != "version"}
    shares = (
        r.decode(await r.tail(topics.routing, 200), RoutingShare)
        if r.exists(topics.routing)
        else []
    )
    newest_share: dict[str, RoutingShare] = {}
    for share in shares:
        if share.version >= getattr(newest_share.get(share.agent_name), "version", -1):
            newest_share[share.agent_name] = share
    late = await _count_since(r, topics.late_events, recent_from)
    letters_total = await _count_since(r, topics.dead_letters, recent_from)
    open_calls = await _open_calls(
        r, topics, now - timedelta(seconds=settings.assembly.abandon_after_s + 60)
    )
    status = Status(
        at=now,
        prefix=settings.kafka.topic_prefix,
        group=group_id,
        group_state=state,
        members=members,
        lag=lags,
        sample_gap_s=sample_gap_s,
        open_calls=open_calls,
        commits=commits,
        last_commit_at=last_commit_at,
        commit_interval_s=settings.commit.interval_s,
        rewarded_since_commit=rewarded_since,
        oldest_uncommitted_at=oldest,
        dead_letters=dict(Counter(d.stage for d in letters)),
        recent_dead_letters=letters[-5:],
        late_events=late,
        alerts=alerts,
        partitions=settings.kafka.partitions,
        dead_letters_total=letters_total,
        comparisons=[newest_cmp[k] for k in sorted(newest_cmp)],
        routing=[newest_share[a] for a in sorted(newest_share)],
        fallbacks=fallbacks_of(compared),
        max_fallback_rate=settings.gateway.rollout.max_fallback_rate,
    )
    status.hints = hints(status)
    return status


async def _count_since(r: TopicReader, topic: str, at: datetime) -> int:
    if not r.exists(topic):
        return 0
    tps = r.partitions(topic)
    ends = await r.end_offsets(tps)
    starts = await r.offsets_at(tps, at, ends)
    return sum(ends[tp] - starts[tp] for tp in tps)


async def _rewarded_since(
    r: TopicReader, topic: str, at: datetime | None
) -> tuple[int, datetime | None]:
    """Rewarded trajectories that arrived after the last commit, and when the first did."""
    if not r.exists(topic):
        return 0, None
    tps = r.partitions(topic)
    ends = await r.end_offsets(tps)
    starts = await r.offsets_at(tps, at, ends) if at is not None else await r.beginning_offsets(tps)
    count = sum(ends[tp] - starts[tp] for tp in tps)
    if count == 0:
        return 0, None
    first = await r.read({tp: (starts[tp], starts[tp] + 1) for tp in tps if ends[tp] > starts[tp]})
    oldest = min(m.timestamp for m in first) if first else None
    return count, (
        datetime.fromtimestamp(oldest / 1000, tz=utcnow().tzinfo) if oldest is not None else None
    )


async def _open_calls(r: TopicReader, topics: Topics, at: datetime) -> int | None:
    """Calls with events since ``at`` and no decision since (nor a late event or dead letter
    with their key: those were handled, not held open); reads keys only."""
    seen: dict[str, set[bytes]] = {}
    closed = (topics.decisions, topics.late_events, topics.dead_letters)
    for topic in (topics.agent_events, *closed):
        if not r.exists(topic):
            seen[topic] = set()
            continue
        tps = r.partitions(topic)
        ends = await r.end_offsets(tps)
        starts = await r.offsets_at(tps, at, ends)
        if sum(ends[tp] - starts[tp] for tp in tps) > OPEN_CALL_SCAN_LIMIT:
            return None
        seen[topic] = {m.key for m in await r.read({tp: (starts[tp], ends[tp]) for tp in tps})}
    return len(seen[topics.agent_events].difference(*(seen[t] for t in closed)))


def render(s: Status, console: Any) -> None:
    """Print the snapshot as one screen (``console`` is a rich Console)."""
    from rich.panel import Panel
    from rich.table import Table

    console.print(
        f"[bold]trajstream[/] {s.prefix}  group [bold]{s.group}[/] ({s.group_state})  "
        f"{s.at:%Y-%m-%d %H:%M:%S} UTC"
    )
    workers = Table(title=f"workers ({len(s.members)})", title_justify="left", expand=True)
    workers.add_column("worker")
    workers.add_column("host")
    workers.add_column("partitions")
    for m in s.members:
        keyed = sorted({p for t, ps in m.partitions.items() if t.startswith(s.prefix) for p in ps})
        ledger = any(t.endswith(".ledger") for t in m.partitions)
        parts = ",".join(map(str, keyed)) + (" + ledger" if ledger else "")
        workers.add_row(m.client_id, m.host, parts or "-")
    console.print(workers)

    lag = Table(title=f"lag (records, {s.sample_gap_s:g}s apart)", title_justify="left")
    lag.add_column("topic")
    lag.add_column("lag", justify="right")
    lag.add_column("change", justify="right")
    lag.add_column("per partition")
    for t in s.lag:
        change = t.lag - t.lag_before
        lag.add_row(
            t.topic,
            str(t.lag),
            f"{change:+d}" if s.sample_gap_s > 0 else "",
            " ".join(f"{p}:{n}" for p, n in sorted(t.partitions.items())),
        )
    console.print(lag)
    opened = "unknown (too many events to scan)" if s.open_calls is None else str(s.open_calls)
    console.print(
        f"open calls: [bold]{opened}[/]   late events (1h): {s.late_events}   "
        f"uncommitted rewarded: {s.rewarded_since_commit}"
    )

    commits = Table(title="last commits", title_justify="left")
    for col in ("seq", "at", "feedbacks", "mean reward", "sent"):
        commits.add_column(col)
    for c in reversed(s.commits):
        commits.add_row(
            str(c.commit_seq),
            f"{c.interval_end:%H:%M:%S}",
            str(c.feedback_count),
            "-" if c.reward_mean is None else f"{c.reward_mean:.3f}",
            "yes" if c.sent else "no (held: reward drop)" if c.held else "no (nothing ready)",
        )
    console.print(commits if s.commits else "last commits: none yet")

    if s.comparisons:
        shares = {r.agent_name: r for r in s.routing}
        cmp = Table(title="policy vs production (newest, Welch)", title_justify="left")
        for col in (
            "agent",
            "span",
            "policy n / mean",
            "fallbacks",
            "production n / mean",
            "difference",
            "verdict",
            "share",
        ):
            cmp.add_column(col)
        for cm in s.comparisons:
            share = shares.get(cm.agent_name)
            version = "" if cm.policy_version is None else f" (v{cm.policy_version})"
            cmp.add_row(
                cm.agent_name,
                cm.span if cm.span == "window" else f"{cm.windows} windows",
                f"{cm.policy_count} / {_fmt(cm.policy_mean)}{version}",
                "-"
                if cm.fallback_rate is None
                else f"{cm.policy_fallbacks + cm.policy_mixed} ({cm.fallback_rate:.0%})",
                f"{cm.production_count} / {_fmt(cm.production_mean)}",
                "-"
                if cm.difference is None
                else f"{cm.difference:+.3f} [{cm.lower:+.3f}, {cm.upper:+.3f}] @ {cm.level:.0%}",
                cm.verdict,
                "-" if share is None else f"{share.share:g} ({share.action})",
            )
        console.print(cmp)
    if s.fallbacks:
        falls = Table(title="calls routed to the policy (last hour)", title_justify="left")
        for col in ("agent", "routed", "answered by the policy", "fell back", "mixed", "rate"):
            falls.add_column(col)
        for f in s.fallbacks:
            falls.add_row(
                f.agent,
                str(f.routed),
                str(f.answered),
                str(f.fallbacks),
                str(f.mixed),
                "-" if f.rate is None else f"{f.rate:.0%}",
            )
        console.print(falls)

    if s.recent_dead_letters:
        letters = Table(title="dead letters (last hour, newest)", title_justify="left")
        for col in ("at", "stage", "source", "reason"):
            letters.add_column(col)
        for d in reversed(s.recent_dead_letters):
            letters.add_row(
                f"{d.failed_at:%H:%M:%S}",
                d.stage,
                f"{d.source_topic}[{d.source_partition}]@{d.source_offset}",
                d.reason[:120],
            )
        console.print(letters)
    if not s.hints:
        console.print(Panel("[green]nothing needs attention[/]"))
    for h in s.hints:
        color = {"error": "red", "warning": "yellow"}.get(h.level, "cyan")
        console.print(Panel(f"{h.what}\n[dim]→ {h.do}[/]", title=h.level, border_style=color))


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"
