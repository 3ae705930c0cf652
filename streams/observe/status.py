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
  hour (``<p>.dead-letters``, ``<p>.late-events``, ``<p>.alerts``).

:func:`collect` does the reading (aiokafka), :func:`hints` is the pure judgement of what needs
attention, :func:`render` prints one screen with rich, :meth:`Status.to_json` is ``--json``.
:class:`TopicReader` is also what the status page reads with.

May import aiokafka, rich, the package's models, codec, settings, topics and errors, and
:mod:`streams.io.kafka` (the one range reader).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError

from ..codec import SchemaRegistry
from ..errors import BrokerError, ConfigError, RecordError
from ..io import kafka
from ..models import CommitRecord, Comparison, DeadLetter, DriftAlert, RoutingShare, utcnow
from ..settings import Settings
from ..topics import Topics

__all__ = [
    "Hint",
    "Member",
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


def input_topics(topics: Topics) -> list[str]:
    """The topics the workers consume (their lag is the group's lag)."""
    return [
        topics.agent_events,
        topics.user_feedback,
        topics.ticks,
        topics.trajectories,
        topics.rewarded,
        topics.ledger,
    ]


# -- reading Kafka -----------------------------------------------------------------------------


class TopicReader:
    """Reads the deployment's topics and its group's offsets; joins no group, commits nothing.

    Use as an async context manager. Every Kafka client of the status command and the status
    page is made here (one place to give them the cluster's security settings).
    """

    def __init__(self, bootstrap: str, codec: SchemaRegistry | None = None) -> None:
        self.bootstrap = bootstrap
        self.codec = codec or SchemaRegistry.default()
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            client_id="trajstream-status",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        # offset requests on a consumer of their own: on the reading one they would queue
        # behind its long-polling fetches (fetch_max_wait_ms each)
        self.offsets = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            client_id="trajstream-status",
            enable_auto_commit=False,
        )
        self.admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, client_id="trajstream-status", request_timeout_ms=15000
        )
        self._partitions: dict[str, list[int]] = {}

    async def __aenter__(self) -> TopicReader:
        try:
            await self.admin.start()
            await self.consumer.start()
            await self.offsets.start()
        except KafkaError as exc:
            await self.aclose()
            raise BrokerError(f"cannot reach Kafka at {self.bootstrap}: {exc}") from exc
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for close in (self.consumer.stop, self.offsets.stop, self.admin.close):
            try:
                await close()
            except Exception:
                pass

    async def refresh(self) -> dict[str, list[int]]:
        """Every topic of the cluster with its partitions (nothing is created)."""
        names = await self.admin.list_topics()
        described = await self.admin.describe_topics(list(names)) if names else []
        self._partitions = {
            d["topic"]: sorted(p["partition"] for p in d["partitions"]) for d in described
        }
        return self._partitions

    async def warm(self, topics: Iterable[str]) -> None:
        """Fetch the consumer's metadata for all of ``topics`` at once: one round trip instead
        of one (with a back-off) per topic at its first offset request."""
        tps = [tp for t in topics for tp in self.partitions(t)]
        if tps:
            await self.offsets.end_offsets(tps)

    def partitions(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in self._partitions.get(topic, [])]

    def exists(self, topic: str) -> bool:
        return topic in self._partitions

    async def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return dict(await self.offsets.end_offsets(list(tps))) if tps else {}

    async def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return dict(await self.offsets.beginning_offsets(list(tps))) if tps else {}

    async def offsets_at(
        self, tps: Sequence[TopicPartition], at: datetime, ends: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The first offset at or after ``at`` per partition (the end when none is that late)."""
        if not tps:
            return {}
        millis = max(0, int(at.timestamp() * 1000))
        found = await self.offsets.offsets_for_times({tp: millis for tp in tps})
        return {tp: found[tp].offset if found.get(tp) else ends[tp] for tp in tps}

    async def read(
        self, ranges: dict[TopicPartition, tuple[int, int]], stall_s: float = 10.0
    ) -> list[Any]:
        """The raw records of each ``[start, end)`` range, in partition order."""
        # a compacted or truncated range stalls: what was there was read
        out = await kafka.fetch_ranges(
            self.consumer, ranges, stall_s=stall_s, on_stall="stop", max_records=5000
        )
        return [m for tp in sorted(out) for m in out[tp]]

    async def since(self, topic: str, at: datetime, limit: int = 1000) -> list[Any]:
        """The raw records of ``topic`` from ``at`` on, at most ``limit`` per partition (the
        newest), oldest first by timestamp."""
        tps = self.partitions(topic)
        ends = await self.end_offsets(tps)
        starts = await self.offsets_at(tps, at, ends)
        ranges = {tp: (max(starts[tp], ends[tp] - limit), ends[tp]) for tp in tps}
        return sorted(await self.read(ranges), key=lambda m: (m.timestamp, m.offset))

    async def tail(self, topic: str, n: int) -> list[Any]:
        """The last ``n`` raw records of each partition of ``topic``, oldest first by time."""
        tps = self.partitions(topic)
        ends = await self.end_offsets(tps)
        firsts = await self.beginning_offsets(tps)
        ranges = {tp: (max(firsts[tp], ends[tp] - n), ends[tp]) for tp in tps}
        return sorted(await self.read(ranges), key=lambda m: (m.timestamp, m.offset))

    def decode(self, messages: Iterable[Any], kind: type[Any]) -> list[Any]:
        """Decode records of one type; a record that does not decode is left out (the
        workers dead-letter bad input; a reader only reports)."""
        out = []
        for m in messages:
            try:
                out.append(self.codec.decode_as(m.value, kind))
            except (RecordError, ValueError):
                continue
        return out

    async def group(self, group_id: str) -> tuple[str, list[Member]]:
        """The group's state and members, with each member's assigned partitions."""
        responses = await self.admin.describe_consumer_groups([group_id])
        state, members = "Dead", []
        for response in responses:
            for group in response.to_object()["groups"]:
                if group["group"] != group_id or group["error_code"]:
                    continue
                state = group["state"] or "Dead"
                for member in group["members"]:
                    partitions: dict[str, list[int]] = {}
                    if member["member_assignment"]:
                        try:
                            decoded = ConsumerProtocolMemberAssignment.decode(
                                member["member_assignment"]
                            )
                            partitions = {t: sorted(ps) for t, ps in decoded.assignment}
                        except Exception:  # not the consumer protocol: partitions unknown
                            partitions = {}
                    members.append(
                        Member(
                            member_id=member["member_id"],
                            client_id=member["client_id"],
                            host=member["client_host"].lstrip("/"),
                            partitions=partitions,
                        )
                    )
        return state, sorted(members, key=lambda m: (m.host, m.member_id))

    async def committed(self, group_id: str) -> dict[TopicPartition, int]:
        offsets = await self.admin.list_consumer_group_offsets(group_id)
        return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}


# -- the snapshot ------------------------------------------------------------------------------


@dataclass
class Member:
    member_id: str
    client_id: str
    host: str
    partitions: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class TopicLag:
    topic: str
    lag: int
    lag_before: int
    partitions: dict[int, int] = field(default_factory=dict)  # partition -> lag
    committed_moved: bool = False
    stalled: list[int] = field(default_factory=list)  # records waited, none committed


@dataclass
class Hint:
    level: str  # "error", "warning" or "info"
    what: str
    do: str


@dataclass
class Status:
    at: datetime
    prefix: str
    group: str
    group_state: str
    members: list[Member]
    lag: list[TopicLag]
    sample_gap_s: float
    open_calls: int | None
    commits: list[CommitRecord]
    last_commit_at: datetime | None
    commit_interval_s: float
    rewarded_since_commit: int
    oldest_uncommitted_at: datetime | None
    dead_letters: dict[str, int]  # per stage, of the newest 1000 per partition
    recent_dead_letters: list[DeadLetter]
    late_events: int
    alerts: list[DriftAlert]
    partitions: int
    dead_letters_total: int = 0  # exact, from the offsets
    hints: list[Hint] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    """The newest comparison of the policy with production per agent and span (last hour)."""
    routing: list[RoutingShare] = field(default_factory=list)
    """The newest routing share per agent (gateway.rollout)."""

    @property
    def total_lag(self) -> int:
        return sum(t.lag for t in self.lag)

    def to_json(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            if isinstance(value, dict):
                return {str(k): plain(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [plain(v) for v in value]
            if hasattr(value, "model_dump"):
                return plain(value.model_dump(mode="python"))
            return value

        data = {k: v for k, v in self.__dict__.items()}
        data["members"] = [asdict(m) for m in self.members]
        data["lag"] = [asdict(t) for t in self.lag]
        data["hints"] = [asdict(h) for h in self.hints]
        data["total_lag"] = self.total_lag
        data["recent_dead_letters"] = [  # without payloads: a summary, not the records
            {k: v for k, v in d.model_dump(mode="python").items() if k != "payload"}
            for d in self.recent_dead_letters
        ]
        return plain(data)  # type: ignore[no-any-return]


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
        async with TopicReader(bootstrap) as own:
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
    newest_cmp = {(c.agent_name, c.span): c for c in compared}
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


# -- what needs attention ----------------------------------------------------------------------


def hints(s: Status) -> list[Hint]:
    """The states of a snapshot that need attention, each with what to do (pure)."""
    out: list[Hint] = []
    if not s.members:
        out.append(
            Hint(
                "error",
                f"no workers in consumer group {s.group}",
                "start one: `trajstream worker` (same app_id and kafka.topic_prefix)",
            )
        )
    elif s.group_state != "Stable":
        out.append(
            Hint(
                "warning",
                f"the group is {s.group_state}: partitions are being reassigned",
                "wait a few seconds; if it stays so, a worker keeps joining and leaving (logs)",
            )
        )
    if len(s.members) > s.partitions:
        out.append(
            Hint(
                "info",
                f"{len(s.members) - s.partitions} of {len(s.members)} workers have no keyed "
                f"partition (kafka.partitions={s.partitions})",
                "more workers than partitions add no throughput",
            )
        )
    total, before = s.total_lag, sum(t.lag_before for t in s.lag)
    # ticks arrive in bursts of one per partition: growth below twice the partitions is noise
    noise = 2 * sum(len(t.partitions) for t in s.lag)
    if s.sample_gap_s > 0 and total - before > noise:
        out.append(
            Hint(
                "warning",
                f"lag grew from {before} to {total} records in {s.sample_gap_s:g}s",
                "the workers fall behind: add workers (up to kafka.partitions), or look for "
                "Trinity errors (trajstream_trinity_errors_total) and slow feedback",
            )
        )
    stalled = [f"{t.topic}[{','.join(map(str, t.stalled))}]" for t in s.lag if t.stalled]
    if s.members and s.sample_gap_s > 0 and stalled:
        out.append(
            Hint(
                "warning",
                f"no offset committed in {s.sample_gap_s:g}s while records wait on "
                + ", ".join(stalled),
                "run again with a longer --gap; if it persists the stage is stuck (Trinity "
                "down? see trajstream_trinity_errors_total), or its worker is: logs, /readyz",
            )
        )
    limit = 2 * s.commit_interval_s
    if s.rewarded_since_commit and s.oldest_uncommitted_at is not None:
        waited = (s.at - s.oldest_uncommitted_at).total_seconds()
        if waited > limit:
            since = (
                f"since the last commit at {s.last_commit_at:%H:%M:%S}"
                if s.last_commit_at
                else "and no commit yet"
            )
            out.append(
                Hint(
                    "error",
                    f"{s.rewarded_since_commit} rewarded trajectories {since}, the oldest "
                    f"{waited:.0f}s ago (> 2 x commit.interval_s = {limit:g}s)",
                    "is Trinity reachable? check trajstream_trinity_errors_total and the "
                    "worker holding the ledger partition",
                )
            )
    if s.dead_letters:
        stages = ", ".join(f"{k} {v}" for k, v in sorted(s.dead_letters.items()))
        out.append(
            Hint(
                "warning",
                f"{max(s.dead_letters_total, sum(s.dead_letters.values()))} dead letters in "
                f"the last hour ({stages})",
                f"read their reasons on {s.prefix}.dead-letters (the status page lists them); "
                "fix the producer or the setting, then replay the source range",
            )
        )
    last = max(s.commits, key=lambda c: c.commit_seq, default=None)
    if last is not None and last.held:
        out.append(
            Hint(
                "warning",
                f"commits are held (commit.hold_on_drift): {last.held_reason}",
                "nothing reaches the trainer until a later window of that agent and model "
                "recovers; once the drop is understood: `trajstream commits resume`",
            )
        )
    for share in s.routing:
        if share.action in ("rollback", "drift"):
            out.append(
                Hint(
                    "warning",
                    f"the policy of {share.agent_name} was rolled back to share {share.share:g} "
                    f"({share.reason}); commits are held",
                    "check the policy's checkpoint; then `trajstream routing resume --agent "
                    f"{share.agent_name}`",
                )
            )
    for alert in s.alerts:
        out.append(
            Hint(
                "warning",
                f"reward drift: {alert.agent_name}/{alert.model} window mean {alert.mean:.3f} "
                f"< {alert.fraction:g} x trailing {alert.trailing_mean:.3f}",
                "compare the window's calls on the status page; a new model or prompt?",
            )
        )
    return out


# -- the screen --------------------------------------------------------------------------------


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
            "production n / mean",
            "difference",
            "verdict",
            "share",
        ):
            cmp.add_column(col)
        for cm in s.comparisons:
            share = shares.get(cm.agent_name)
            cmp.add_row(
                cm.agent_name,
                cm.span if cm.span == "window" else f"{cm.windows} windows",
                f"{cm.policy_count} / {_fmt(cm.policy_mean)}",
                f"{cm.production_count} / {_fmt(cm.production_mean)}",
                "-"
                if cm.difference is None
                else f"{cm.difference:+.3f} [{cm.lower:+.3f}, {cm.upper:+.3f}] @ {cm.level:.0%}",
                cm.verdict,
                "-" if share is None else f"{share.share:g} ({share.action})",
            )
        console.print(cmp)

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
