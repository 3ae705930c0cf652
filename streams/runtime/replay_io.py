"""Replay's edges: reading the range from Kafka (merged per partition by timestamp, the order
the live stages saw it in), reading and writing ``<p>.replayed``, sending feedback and commits to
Trinity, and the export manifest. Helpers of :func:`streams.runtime.replay.run_replay`.

May import: the core, :mod:`streams.io`, :mod:`streams.export`, the top-level modules, rich.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..codec import SchemaRegistry
from ..core.backfill import (
    Backfill,
    FeedbackPlan,
    ack_key,
    commit_key,
    ledger_key,
    read_ledger,
    uncommitted_acks,
)
from ..core.feedback import FeedbackRequest, deliver
from ..core.judge import JudgeStage
from ..core.ledger import LedgerConfig
from ..core.retry import RetryPolicy
from ..envelope import Edge, Envelope
from ..errors import BrokerError, ConfigError, TrinityError, TrinityRejected
from ..export.dataset import EXPORT_SCHEMA_VERSION
from ..export.redact import Redactor
from ..io import kafka
from ..models import CommitRecord, JudgeRequest, JudgeVerdict, LedgerState, utcnow
from ..topics import Topics
from .replay_options import ReplayError, ReplayOptions
from .replay_report import Distribution, ReplayResult, progress
from .replay_runner import ReplayRunner, SourceRecord

if TYPE_CHECKING:
    from rich.console import Console

    from ..io.trinity import TrinityClient
    from ..settings import Settings

__all__ = [
    "Replayed",
    "Sent",
    "judge_missing",
    "manifest",
    "read_range",
    "read_replayed",
    "read_verdicts",
    "resolve_range",
    "send_to_trinity",
]


async def resolve_range(
    consumer: Any,
    existing: dict[str, list[int]],
    prefix: str,
    options: ReplayOptions,
    now: datetime,
    lookback: timedelta,
) -> tuple[dict[Any, tuple[int, int]], dict[str, Any]]:
    """The offsets to read, per topic partition, and the description of the source."""
    from aiokafka import TopicPartition

    events, feedback = f"{prefix}.agent-events", f"{prefix}.user-feedback"
    inputs = [t for t in (events, feedback) if t in existing]
    tps = [TopicPartition(t, p) for t in inputs for p in existing[t]]
    first = await consumer.beginning_offsets(tps)
    last = await consumer.end_offsets(tps)
    ranges: dict[Any, tuple[int, int]] = {}
    source: dict[str, Any] = {"prefix": prefix, "topics": {}}

    if options.offsets:
        for spec in options.offsets:
            if spec.topic not in existing:
                raise ConfigError(f"unknown topic {spec.topic}")
            tp = TopicPartition(spec.topic, spec.partition)
            if tp not in last:
                raise ConfigError(f"{spec.topic} has no partition {spec.partition}")
            start = max(spec.start, first[tp])
            end = min(spec.end if spec.end is not None else last[tp], last[tp])
            ranges[tp] = (start, max(start, end))
        if not any(e > s for s, e in ranges.values()):
            raise ReplayError("the --offsets select no records (the partitions hold none there)")
        source["mode"] = "offsets"
    else:
        since, until = options.since, options.until
        read_from = await kafka.offsets_at(
            consumer, tps, since - lookback if since else None, first, last
        )
        in_range = await kafka.offsets_at(consumer, tps, since, first, last)
        read_to = await kafka.offsets_at(consumer, tps, until, last, last)
        for tp in tps:
            ranges[tp] = (read_from[tp], max(read_from[tp], read_to[tp]))
        in_range_events = sum(
            max(0, read_to[tp] - in_range[tp]) for tp in tps if tp.topic == events
        )
        if in_range_events == 0:
            raise ReplayError(
                f"no agent events in {events} from {since.isoformat() if since else 'the start'}"
                f" to {until.isoformat() if until else 'now'}"
            )
        source.update(
            mode="time",
            since=since.isoformat() if since else None,
            until=(until or now).isoformat(),
            lookback_s=lookback.total_seconds(),
            events_in_range=in_range_events,
        )
    for tp, (start, end) in sorted(ranges.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
        source["topics"].setdefault(tp.topic, {})[str(tp.partition)] = [start, end]
    return ranges, source


async def read_range(
    consumer: Any, ranges: dict[Any, tuple[int, int]], core: ReplayRunner, console: Console
) -> int:
    """Read the ranges partition by partition, each partition's events and feedback merged by
    timestamp (the order the live stages saw them in), into the core."""
    total = sum(end - start for start, end in ranges.values())
    by_partition: dict[int, list[Any]] = {}
    for tp in ranges:
        by_partition.setdefault(tp.partition, []).append(tp)
    done = 0
    with progress(console) as bar:
        task = bar.add_task("reading", total=total)
        for partition in sorted(by_partition):
            tps = [tp for tp in by_partition[partition] if ranges[tp][1] > ranges[tp][0]]
            if not tps:
                continue
            fetched = await fetch(
                consumer, {tp: ranges[tp] for tp in tps}, lambda n: bar.advance(task, n)
            )
            streams = [
                [
                    source_record(m, "event" if tp.topic.endswith(".agent-events") else "feedback")
                    for m in fetched[tp]
                ]
                for tp in sorted(tps, key=lambda tp: not tp.topic.endswith(".agent-events"))
            ]
            core.feed_all(heapq.merge(*streams, key=lambda r: r.timestamp))
            done += sum(ranges[tp][1] - ranges[tp][0] for tp in tps)
            bar.update(task, completed=done)
    return sum(core.stats[k] for k in ("records.event", "records.feedback"))


def source_record(message: Any, kind: Literal["event", "feedback"]) -> SourceRecord:
    return SourceRecord(
        kind=kind,
        partition=message.partition,
        offset=message.offset,
        timestamp=datetime.fromtimestamp(message.timestamp / 1000, UTC),
        key=message.key,
        value=message.value or b"",
    )


async def fetch(
    consumer: Any, ranges: dict[Any, tuple[int, int]], advance: Callable[[int], None]
) -> dict[Any, list[Any]]:
    try:
        return await kafka.fetch_ranges(consumer, ranges, advance)
    except BrokerError as exc:
        raise ReplayError(str(exc)) from exc


async def _whole(consumer: Any, topic: str, partitions: list[int]) -> list[Any]:
    try:
        return await kafka.read_whole(consumer, topic, partitions)
    except BrokerError as exc:
        raise ReplayError(str(exc)) from exc


@dataclass(slots=True)
class Replayed:
    """What ``<p>.replayed`` says of one replay: the trajectory ids acknowledged under it, the
    acknowledgements an interrupted run recorded after its last commit (as recorded), and its
    commit ledger (None: it never committed)."""

    acknowledged: set[str] = field(default_factory=set)
    uncommitted: list[Envelope] = field(default_factory=list)
    ledger: LedgerState | None = None


async def read_replayed(
    consumer: Any, existing: dict[str, list[int]], topic: str, rid: str, codec: SchemaRegistry
) -> Replayed:
    """What ``<p>.replayed`` says of replay ``rid`` (see :func:`read_ledger`)."""

    if topic not in existing:
        return Replayed()
    messages = await _whole(consumer, topic, existing[topic])
    if not messages:
        return Replayed()
    acknowledged, _ = read_ledger((m.key for m in messages), rid)
    key = ledger_key(rid)
    ledgers = [m.value for m in messages if m.key == key and m.value]
    ledger = codec.decode_as(ledgers[-1], LedgerState) if ledgers else None
    edge = Edge(codec)
    uncommitted = [
        edge.open(topic, 0, -1, None, value)
        for value in uncommitted_acks(((m.key, m.value) for m in messages), rid)
    ]
    return Replayed(acknowledged, uncommitted, ledger)


@dataclass(slots=True)
class Sent:
    """What :func:`send_to_trinity` did: feedback sent, acknowledged, rejected (call id, why),
    and the commits Trinity took."""

    sent: int = 0
    acked: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)
    commits: int = 0


async def send_to_trinity(
    settings: Settings,
    bootstrap: str,
    client_id: str,
    rid: str,
    plan: FeedbackPlan,
    replayed: Replayed,
    cfg: LedgerConfig,
    console: Console,
    trinity_factory: Callable[[], TrinityClient] | None,
    codec: SchemaRegistry,
) -> Sent:
    """Feedback for every planned trajectory, each acknowledgement recorded on
    ``<p>.replayed`` before the commit that carries it; commits by the workers' ledger stage
    and commit protocol (:class:`~streams.core.backfill.Backfill` with ``cfg``: the replay's
    :class:`~streams.models.LedgerState` under ``<replay_id>#ledger`` is the write-ahead
    record)."""
    from ..io.trinity import TrinityClient, TrinityGaveUp, retrying

    result = Sent()
    topic = Topics(settings.kafka.topic_prefix, settings.kafka.partitions).replayed
    security = settings.kafka.security
    await kafka.ensure_compacted(
        bootstrap,
        topic,
        settings.kafka.replication_factor,
        security,
        min_insync_replicas=settings.kafka.min_insync,
    )
    producer = kafka.producer(bootstrap, security, client_id=client_id)
    trinity = (trinity_factory or (lambda: TrinityClient.from_settings(settings.trinity)))()
    policy = RetryPolicy(max_age=settings.trinity.retry_max_age_s)

    async def retried(call: Callable[[], Any], what: str) -> tuple[int, Any]:
        try:
            return await retrying(call, policy, what)
        except TrinityGaveUp as exc:
            raise ReplayError(
                f"{what}: {exc}; re-run the replay to resume (acknowledged feedback is skipped)"
            ) from exc

    in_flight: list[Any] = []  # acknowledgements on their way to <p>.replayed

    class Port:
        """Trinity for the commit protocol, each call under the one retry policy, and
        ``<p>.replayed`` for the ledger and its commits (every acknowledgement before them)."""

        @property
        def trinity(self) -> Port:
            return self

        async def metrics(self) -> dict[str, Any]:
            return (await retried(trinity.metrics, "metrics"))[1]  # type: ignore[no-any-return]

        async def commit(self) -> dict[str, Any]:
            return (await retried(trinity.commit, "commit"))[1]  # type: ignore[no-any-return]

        async def write_ahead(self, state: LedgerState) -> None:
            await asyncio.gather(*in_flight)  # the acks are durable before the commit
            in_flight.clear()
            await producer.send_and_wait(topic, key=ledger_key(rid), value=codec.encode(state))

        async def recorded(self, record: CommitRecord, state: LedgerState) -> None:
            await asyncio.gather(*in_flight)
            in_flight.clear()
            if record.sent:
                result.commits += 1
            await producer.send_and_wait(topic, key=commit_key(rid), value=codec.encode(record))
            await producer.send_and_wait(topic, key=ledger_key(rid), value=codec.encode(state))

    await producer.start()
    try:
        backfill = Backfill(cfg, Port(), codec=codec, state=replayed.ledger, clock=utcnow)
        # an earlier run stopped between writing its commit ahead and recording it, or with
        # acknowledgements it did not commit: resolved, and carried by the next commit
        await backfill.resume(replayed.uncommitted)

        with progress(console) as bar:
            task = bar.add_task("feedback to Trinity", total=len(plan.send))

            async def send(request: FeedbackRequest, what: str) -> int:
                call = functools.partial(
                    trinity.feedback,
                    request.msg_ids,
                    request.reward,
                    request.task_id,
                    request.run_id,
                )
                return (await retried(call, what))[0]

            for rewarded in plan.send:
                result.sent += 1
                try:  # the live feedback stage's own step (one request per distinct reward)
                    ack = await deliver(rewarded, send, utcnow)
                except TrinityRejected as exc:
                    result.rejected.append((rewarded.call_id, str(exc)))
                    bar.advance(task)
                    continue
                result.acked += 1
                key = ack_key(rid, rewarded.trajectory_id)
                in_flight.append(await producer.send(topic, key=key, value=codec.encode(ack)))
                await backfill.acked(ack)
                bar.advance(task)
            await backfill.close()
        await asyncio.gather(*in_flight)
    except TrinityError as exc:
        raise ReplayError(f"Trinity: {exc}") from exc
    finally:
        await producer.stop()
        await trinity.aclose()
    return result


def manifest(
    result: ReplayResult,
    settings: Settings,
    options: ReplayOptions,
    redactor: Redactor,
    codec: SchemaRegistry,
) -> dict[str, Any]:
    from ..models import RewardedTrajectory as RT
    from ..models import Trajectory as T

    core = result.core
    scored = [r.reward for _, r in core.scored()]
    return {
        "export_schema_version": EXPORT_SCHEMA_VERSION,
        "created_at": utcnow().isoformat(),
        "replay_id": result.replay_id,
        "source": result.source,
        "strategy": core.strategy.name,
        "reward": {"function": core.rewarders[0].name, "version": core.rewarders[0].version},
        "settings": {
            "abandon_after_s": settings.assembly.abandon_after_s,
            "feedback_grace_s": settings.reward.feedback_grace_s,
            "score_incomplete": settings.reward.score_incomplete,
        },
        "avro_schemas": {m.avro_name: codec.fingerprint_of(m).hex() for m in (T, RT)},
        "counts": {
            "records": result.records,
            "calls_closed": core.stats["calls.closed"],
            "calls_selected": core.stats["calls.selected"],
            "trajectories": core.stats["trajectories"],
            "rewarded": core.stats["rewarded.0"],
            "reward_errors": core.stats["reward_errors.0"],
            "not_scored_incomplete": core.stats["trajectories.incomplete"],
            "open_at_end": len(core.incomplete),
            "invalid_records": core.stats["records.invalid"],
        },
        "reward_distribution": Distribution.of(scored).as_dict(),
        "redaction": redactor.summary(),
    }


async def read_verdicts(
    consumer: Any, existing: dict[str, list[int]], topic: str
) -> list[tuple[int, bytes | None, bytes]]:
    """Every record of ``<p>.verdicts`` (partition, key, value), in offset order per partition
    (none when the topic does not exist)."""

    if topic not in existing:
        return []
    return [
        (m.partition, m.key, m.value or b"") for m in await _whole(consumer, topic, existing[topic])
    ]


async def judge_missing(
    settings: Settings,
    bootstrap: str,
    core: ReplayRunner,
    console: Console,
    codec: SchemaRegistry,
) -> None:
    """Verdicts for the calls the range needs and ``<p>.verdicts`` did not have, by the
    workers' judge stage (:class:`~streams.core.judge.JudgeStage`) over HTTP (the one retry
    loop, :func:`streams.io.judge.judge_port`), and recorded there on the call's partition so
    that the next replay and the workers reuse them; or, with
    ``reward.judge.replay_missing = dead_letter``, verdicts without a score, the judge not
    asked and nothing recorded. The runner scores with them (:meth:`ReplayRunner.judge`)."""
    from ..io.judge import JudgeClient, judge_port, policy_of

    j = settings.reward.judge
    if j.replay_missing == "dead_letter":
        reason = (
            "no verdict on the verdicts topic for this call, and reward.judge.replay_missing "
            "is dead_letter"
        )
        await core.judge(JudgeStage(decline=reason), _not_asked, utcnow)
        return
    asked = len(core.judge_requests)
    console.print(f"asking the judge for {asked} call(s) without a stored verdict")
    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    client = JudgeClient.from_settings(j)
    port = judge_port(lambda: client, policy_of(j), slots=asyncio.Semaphore(j.max_connections))

    async def ask(request: JudgeRequest) -> JudgeVerdict:
        # the age counts from now: these requests were made by this replay, just now (the
        # workers' requests are dated by the clock the judge stage reads; replay's by record time)
        fresh = request.model_copy(update={"requested_at": utcnow()})
        verdict = await port(fresh)
        return verdict.model_copy(update={"requested_at": request.requested_at})

    try:
        verdicts = await core.judge(JudgeStage(), ask, utcnow)
    finally:
        await client.aclose()
    await kafka.create_topics(
        bootstrap,
        {topics.verdicts: settings.kafka.partitions},
        settings.kafka.replication_factor,
        security=settings.kafka.security,
        configs=topics.configs(),
        min_insync_replicas=settings.kafka.min_insync,
    )
    producer = kafka.producer(bootstrap, settings.kafka.security)
    await producer.start()
    try:
        for verdict in verdicts:
            await producer.send_and_wait(
                topics.verdicts,
                codec.encode(verdict),
                key=verdict.call_id.encode(),
                partition=core.partition_of(verdict.call_id),
            )
    finally:
        await producer.stop()


async def _not_asked(request: JudgeRequest) -> JudgeVerdict:  # pragma: no cover - declined
    raise AssertionError("a declining judge stage asks no one")
