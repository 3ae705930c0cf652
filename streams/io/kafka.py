"""Every Kafka client of the product is built here: admin (topic creation, listing), consumers
and the one bounded range reader (:func:`fetch_ranges`, :func:`read_whole`: replay, the
status reader, ``trajstream audit``, the final commit's unread ledger records), producers.

Topic names come only from :class:`streams.topics.Topics`. The Faust worker builds its own
clients from the same bootstrap string and :func:`streams.io.security.faust_credentials`
(:mod:`streams.runtime.live`). Every builder takes the ``kafka.security`` settings (TLS, SASL)
and passes them on through :func:`streams.io.security.kafka_client_kwargs`.

May import: aiokafka, streams.io.security, the top-level modules (errors, settings, topics).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from ..errors import BrokerError, ConfigError
from ..settings import KafkaSecuritySettings
from ..wire import TopicFraming
from .security import kafka_client_kwargs

__all__ = [
    "PRODUCER_DEFAULTS",
    "FramingProducer",
    "admin",
    "consumer",
    "create_topics",
    "ensure_compacted",
    "fetch_ranges",
    "offsets_at",
    "process_framing",
    "producer",
    "read_whole",
    "topic_partitions",
    "use_framing",
    "wait_until_ready",
    "whole_ranges",
]

REQUEST_TIMEOUT_MS = 15000


def _security(security: KafkaSecuritySettings | None) -> dict[str, Any]:
    return kafka_client_kwargs(security or KafkaSecuritySettings())


def admin(bootstrap: str, security: KafkaSecuritySettings | None = None) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS, **_security(security)
    )


PRODUCER_DEFAULTS: dict[str, Any] = {"acks": "all", "enable_idempotence": True, "linger_ms": 5}
"""What every producer of the product gets (the gateway's, the OTLP ingest's, the SDK's,
replay's, the CLI's; the workers' Faust producer gets the same acks and idempotence, see
:mod:`streams.runtime.live`): a record is acknowledged once every in-sync replica has it
(``acks=all``; with ``min.insync.replicas`` 2 on a cluster of 3, a write survives the loss
of a broker), and a retried send is written once (idempotence: the broker drops a batch it
already has, by producer id and sequence number)."""


class FramingProducer(AIOKafkaProducer):  # type: ignore[misc]
    """An aiokafka producer that writes each record in its topic's wire format
    (:class:`streams.wire.TopicFraming`: Confluent's, when a schema registry is set)."""

    def __init__(self, *args: Any, framing: TopicFraming, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.framing = framing

    async def send(self, topic: str, value: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, bytes | bytearray):
            value = self.framing.reframe(topic, bytes(value))
        return await super().send(topic, value, *args, **kwargs)


_PROCESS_FRAMING: list[TopicFraming] = []


def use_framing(framing: TopicFraming | None) -> None:
    """From now on, every producer this module builds in this process writes the topics
    ``framing`` names in their wire format (:func:`streams.io.registry.connect` calls this:
    once a process registered its subjects, all its writers use them). Topics already set
    keep theirs unless ``framing`` names them too; None changes nothing."""
    if framing is None:
        return
    merged = dict(_PROCESS_FRAMING[0].prefixes) if _PROCESS_FRAMING else {}
    merged.update(framing.prefixes)
    _PROCESS_FRAMING[:] = [TopicFraming(merged)]


def process_framing() -> TopicFraming | None:
    """The framing :func:`use_framing` installed, or None (single-object encoding)."""
    return _PROCESS_FRAMING[0] if _PROCESS_FRAMING else None


def producer(
    bootstrap: str,
    security: KafkaSecuritySettings | None = None,
    *,
    framing: TopicFraming | None = None,
    **kwargs: Any,
) -> AIOKafkaProducer:
    """An idempotent producer that waits for every in-sync replica (``acks=all``);
    with ``framing`` (a schema registry; default: :func:`process_framing`), one that writes
    Confluent's wire format."""
    options: dict[str, Any] = dict(PRODUCER_DEFAULTS)
    options.update(kwargs)
    framing = framing or process_framing()
    if framing is not None:
        return FramingProducer(
            bootstrap_servers=bootstrap, framing=framing, **options, **_security(security)
        )
    return AIOKafkaProducer(bootstrap_servers=bootstrap, **options, **_security(security))


def consumer(
    bootstrap: str, security: KafkaSecuritySettings | None = None, **kwargs: Any
) -> AIOKafkaConsumer:
    """A consumer from the earliest offset that commits nothing unless told to."""
    options: dict[str, Any] = {"auto_offset_reset": "earliest", "enable_auto_commit": False}
    options.update(kwargs)
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, **options, **_security(security))


async def create_topics(
    bootstrap: str,
    wanted: dict[str, int],
    replication: int = 1,
    *,
    security: KafkaSecuritySettings | None = None,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    min_insync_replicas: int | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    ``configs`` gives some topics their topic configs (e.g. ``cleanup.policy``);
    ``min_insync_replicas`` (``kafka.min_insync``) is given to every topic created. An existing
    topic with another partition count is an error: co-partitioning would break.
    """
    configs = _with_min_insync(wanted, configs or {}, min_insync_replicas)
    client = admin(bootstrap, security)
    try:
        await client.start()
    except Exception as exc:
        raise BrokerError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        existing = set(await client.list_topics())
        missing = [
            NewTopic(t, n, replication, topic_configs=dict(configs.get(t, {})))
            for t, n in wanted.items()
            if t not in existing
        ]
        if missing:
            brokers = len((await client.describe_cluster())["brokers"])
            if replication > brokers:
                raise ConfigError(
                    f"kafka.replication_factor is {replication}, but the cluster at {bootstrap} "
                    f"has {brokers} broker{'s' if brokers != 1 else ''}: lower the setting"
                )
            try:
                response = await client.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker created them at the same moment
            else:
                # the admin client returns per-topic errors instead of raising them
                failed = [
                    (name, code, message)
                    for name, code, *rest in response.topic_errors
                    for message in [rest[0] if rest else ""]
                    if code not in (0, TopicAlreadyExistsError.errno)
                ]
                if failed:
                    raise BrokerError(
                        "Kafka refused to create "
                        + "; ".join(f"{n}: error {c} {m or ''}".strip() for n, c, m in failed)
                    )
        # every wanted topic, also one this client did not list (another process created it
        # meanwhile: "already exists") or listed before its partitions were there
        for name, have in (await _partition_counts(client, list(wanted))).items():
            if have != wanted[name]:
                raise BrokerError(
                    f"topic {name} has {have} partitions, the settings say {wanted[name]} "
                    "(kafka.partitions): co-partitioned topics must agree"
                )
        return [t.name for t in missing]
    finally:
        await client.close()


CREATING_TIMEOUT_S = 30.0
"""How long :func:`create_topics` waits for a topic that another process is creating."""


async def _partition_counts(
    client: AIOKafkaAdminClient, names: list[str], timeout_s: float | None = None
) -> dict[str, int]:
    """The partition count of each topic in ``names``, once each is settled.

    A topic that another process (a second worker starting at the same moment) is creating
    is listed before its partitions are: described then, it has none, or an error such as
    LEADER_NOT_AVAILABLE. Such a topic is described again until it has partitions, for at
    most ``timeout_s`` (:data:`CREATING_TIMEOUT_S`), so that a topic in creation is never taken
    for a topic of the wrong size."""
    timeout_s = CREATING_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    pending = list(names)
    while True:
        unsettled = []
        for desc in await client.describe_topics(pending):
            name, partitions = desc["topic"], desc.get("partitions") or []
            if desc.get("error_code", 0) or not partitions:
                unsettled.append(name)
            else:
                counts[name] = len(partitions)
        if not unsettled:
            return counts
        if time.monotonic() >= deadline:
            raise BrokerError(
                "topic(s) " + ", ".join(sorted(unsettled)) + " still have no partitions "
                f"after {timeout_s:g}s (being created by another process, or a broker is down?)"
            )
        pending = unsettled
        await asyncio.sleep(0.2)


def _with_min_insync(
    wanted: Iterable[str], configs: Mapping[str, Mapping[str, str]], min_insync: int | None
) -> dict[str, dict[str, str]]:
    out = {name: dict(config) for name, config in configs.items()}
    if min_insync is not None:
        for name in wanted:
            out.setdefault(name, {}).setdefault("min.insync.replicas", str(min_insync))
    return out


async def ensure_compacted(
    bootstrap: str,
    topic: str,
    replication: int,
    security: KafkaSecuritySettings | None = None,
    min_insync_replicas: int | None = None,
) -> None:
    """Create a compacted single-partition topic (``<p>.replayed``) unless it exists."""
    config = {"cleanup.policy": "compact"}
    if min_insync_replicas is not None:
        config["min.insync.replicas"] = str(min_insync_replicas)
    client = admin(bootstrap, security)
    await client.start()
    try:
        if topic not in set(await client.list_topics()):
            try:
                await client.create_topics([NewTopic(topic, 1, replication, topic_configs=config)])
            except TopicAlreadyExistsError:
                pass
    finally:
        await client.close()


async def topic_partitions(
    bootstrap: str, security: KafkaSecuritySettings | None = None
) -> dict[str, list[int]]:
    """Every topic of the cluster with its partitions (without creating any)."""
    client = admin(bootstrap, security)
    try:
        await client.start()
    except Exception as exc:
        raise BrokerError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        names = await client.list_topics()
        described = await client.describe_topics(list(names)) if names else []
        return {d["topic"]: sorted(p["partition"] for p in d["partitions"]) for d in described}
    finally:
        await client.close()


async def wait_until_ready(
    bootstrap: str,
    topics: Iterable[str],
    *,
    group_id: str | None = None,
    security: KafkaSecuritySettings | None = None,
    timeout: float = 30.0,
) -> None:
    """Wait until every partition of ``topics`` has a leader and the coordinator of
    ``group_id`` answers.

    Right after topics are created, or on a fresh cluster (whose ``__consumer_offsets`` topic
    the first group lookup creates), a worker's clients would meet "topic not found" and
    "coordinator not available" answers and log them as errors while they retry. Asking here
    first, quietly, keeps a healthy start free of ERROR lines.
    """
    names = list(topics)
    client = admin(bootstrap, security)
    deadline = time.monotonic() + timeout
    try:
        await client.start()
    except Exception as exc:
        raise BrokerError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        while True:
            described = await client.describe_topics(names) if names else []
            waiting = [
                d["topic"]
                for d in described
                if d["error_code"] != 0 or any(p["leader"] < 0 for p in d["partitions"])
            ]
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise BrokerError(f"topics without a leader after {timeout:g}s: {waiting}")
            await asyncio.sleep(0.2)
        while group_id is not None:
            try:
                await client.find_coordinator(group_id)
                break
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise BrokerError(
                        f"no coordinator for consumer group {group_id} (app_id): {exc}"
                    ) from exc
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def offsets_at(
    reader: AIOKafkaConsumer,
    tps: list[TopicPartition],
    at: datetime | None,
    default: dict[TopicPartition, int],
    last: dict[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """The first offset at or after ``at`` per partition (``default`` when ``at`` is None, the
    end when no record is that late)."""
    if at is None:
        return dict(default)
    millis = max(0, int(at.timestamp() * 1000))
    found = await reader.offsets_for_times({tp: millis for tp in tps})
    return {tp: min(found[tp].offset, last[tp]) if found.get(tp) else last[tp] for tp in tps}


async def fetch_ranges(
    reader: AIOKafkaConsumer,
    ranges: dict[TopicPartition, tuple[int, int]],
    advance: Callable[[int], None] = lambda n: None,
    stall_s: float = 30.0,
    *,
    on_stall: Literal["raise", "stop"] = "raise",
    max_records: int | None = None,
) -> dict[TopicPartition, list[Any]]:
    """Every record of the ranges (start inclusive, end exclusive), read by a consumer without a
    group (manually assigned, so the live group's offsets never move). A range that stops
    growing for ``stall_s`` before its end is an error (``on_stall="raise"``: a
    :class:`~streams.errors.BrokerError`), or the end of what there is to read (``"stop"``: a
    compacted or truncated range, for a reader that only reports). Empty ranges are skipped."""
    ranges = {tp: r for tp, r in ranges.items() if r[1] > r[0]}
    if not ranges:
        return {}
    reader.assign(list(ranges))
    for tp, (start, _) in ranges.items():
        reader.seek(tp, start)
    out: dict[TopicPartition, list[Any]] = {tp: [] for tp in ranges}
    remaining = set(ranges)
    last_progress = time.monotonic()
    while remaining:
        batch = await reader.getmany(*remaining, timeout_ms=500, max_records=max_records)
        for tp, messages in batch.items():
            end = ranges[tp][1]
            kept = [m for m in messages if m.offset < end]
            out[tp].extend(kept)
            advance(len(kept))
        for tp in list(remaining):
            if await reader.position(tp) >= ranges[tp][1]:
                remaining.discard(tp)
        if batch:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_s:
            if on_stall == "stop":
                break
            missing = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(remaining))
            raise BrokerError(
                f"no records from {missing} for {stall_s:g}s before the end of "
                "the range (broker unavailable?)"
            )
    return out


async def whole_ranges(
    reader: AIOKafkaConsumer, tps: Iterable[TopicPartition]
) -> dict[TopicPartition, tuple[int, int]]:
    """``[beginning, end)`` of each partition that holds records now."""
    tps = list(tps)
    if not tps:
        return {}
    first = await reader.beginning_offsets(tps)
    last = await reader.end_offsets(tps)
    return {tp: (first[tp], last[tp]) for tp in tps if last[tp] > first[tp]}


async def read_whole(
    reader: AIOKafkaConsumer,
    topic: str,
    partitions: Iterable[int],
    stall_s: float = 30.0,
    *,
    on_stall: Literal["raise", "stop"] = "raise",
) -> list[Any]:
    """Every record ``topic`` holds now, partition by partition, each in offset order."""
    tps = [TopicPartition(topic, p) for p in partitions]
    fetched = await fetch_ranges(
        reader, await whole_ranges(reader, tps), stall_s=stall_s, on_stall=on_stall
    )
    return [m for tp in sorted(fetched) for m in fetched[tp]]
