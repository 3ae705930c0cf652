"""Every Kafka client of the product is built here: admin (topic creation, listing), consumers
(the bounded range reader of replay), producers.

Topic names come only from :class:`streams.topics.Topics`. The Faust worker builds its own
clients from the same bootstrap string (:mod:`streams.runtime.live`). One place to add the
cluster's security settings when they come.

May import: aiokafka, the top-level modules (errors, topics).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from ..errors import BrokerError

__all__ = [
    "admin",
    "consumer",
    "create_topics",
    "ensure_compacted",
    "fetch_ranges",
    "offsets_at",
    "producer",
    "topic_partitions",
]

REQUEST_TIMEOUT_MS = 15000


def admin(bootstrap: str) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)


def producer(bootstrap: str, **kwargs: Any) -> AIOKafkaProducer:
    """An idempotent producer that waits for every replica (``acks=all``)."""
    options: dict[str, Any] = {"acks": "all", "enable_idempotence": True, "linger_ms": 5}
    options.update(kwargs)
    return AIOKafkaProducer(bootstrap_servers=bootstrap, **options)


def consumer(bootstrap: str, **kwargs: Any) -> AIOKafkaConsumer:
    """A consumer from the earliest offset that commits nothing unless told to."""
    options: dict[str, Any] = {"auto_offset_reset": "earliest", "enable_auto_commit": False}
    options.update(kwargs)
    return AIOKafkaConsumer(bootstrap_servers=bootstrap, **options)


async def create_topics(bootstrap: str, wanted: dict[str, int], replication: int = 1) -> list[str]:
    """Create the topics that do not exist yet; returns the names created.

    An existing topic with another partition count is an error: co-partitioning would break.
    """
    client = admin(bootstrap)
    try:
        await client.start()
    except Exception as exc:
        raise BrokerError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        existing = set(await client.list_topics())
        if existing & set(wanted):
            described = await client.describe_topics([t for t in wanted if t in existing])
            for desc in described:
                name, have = desc["topic"], len(desc["partitions"])
                if have != wanted[name]:
                    raise BrokerError(
                        f"topic {name} has {have} partitions, the settings say {wanted[name]} "
                        "(kafka.partitions): co-partitioned topics must agree"
                    )
        missing = [NewTopic(t, n, replication) for t, n in wanted.items() if t not in existing]
        if missing:
            try:
                await client.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker created them at the same moment
        return [t.name for t in missing]
    finally:
        await client.close()


async def ensure_compacted(bootstrap: str, topic: str, replication: int) -> None:
    """Create a compacted single-partition topic (``<p>.replayed``) unless it exists."""
    client = admin(bootstrap)
    await client.start()
    try:
        if topic not in set(await client.list_topics()):
            try:
                await client.create_topics(
                    [NewTopic(topic, 1, replication, topic_configs={"cleanup.policy": "compact"})]
                )
            except TopicAlreadyExistsError:
                pass
    finally:
        await client.close()


async def topic_partitions(bootstrap: str) -> dict[str, list[int]]:
    """Every topic of the cluster with its partitions (without creating any)."""
    client = admin(bootstrap)
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
    advance: Callable[[int], None],
    stall_s: float = 30.0,
) -> dict[TopicPartition, list[Any]]:
    """Every record of the ranges (start inclusive, end exclusive), read by a consumer without a
    group (manually assigned, so the live group's offsets never move); a range that stops
    growing for ``stall_s`` before its end is an error."""
    reader.assign(list(ranges))
    for tp, (start, _) in ranges.items():
        reader.seek(tp, start)
    out: dict[TopicPartition, list[Any]] = {tp: [] for tp in ranges}
    remaining = set(ranges)
    last_progress = time.monotonic()
    while remaining:
        batch = await reader.getmany(*remaining, timeout_ms=500)
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
            missing = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(remaining))
            raise BrokerError(
                f"no records from {missing} for {stall_s:g}s before the end of "
                "the range (broker unavailable?)"
            )
    return out
