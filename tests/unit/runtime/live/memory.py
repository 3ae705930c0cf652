"""The live worker's objects over in-memory parts, for the unit tests: topics that record what
was sent (:class:`MemoryTopic`), a producer whose flushes are counted, a clock the test moves,
Faust events built from bytes, and :func:`stages`, which composes the worker as
:func:`streams.runtime.live.app.compose` does for Faust, over these parts and memory stores."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from streams.codec import SchemaRegistry
from streams.core.store import MemoryStore
from streams.envelope import Envelope
from streams.io.judge import JudgeClient
from streams.models import AvroModel
from streams.observe.metrics import Metrics
from streams.runtime.live.app import OUTPUTS, Rules, Stages, compose
from streams.runtime.live.channels import HANDLED_HEADERS
from streams.runtime.live.sink import Sink
from streams.settings import Settings
from tests.unit.factories import at

CODEC = SchemaRegistry.default()


@dataclass
class Sent:
    """One record sent to a :class:`MemoryTopic`."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None
    handled: bool  # sent with the HANDLED header

    @property
    def record(self) -> AvroModel:
        return CODEC.decode(self.value)


class MemoryTopic:
    """A topic: what was sent to it goes to ``sent`` (shared by the topics of one worker, in the
    order sent). Each delivery is done at once, or, with ``held``, waits until the test sets it
    (``held`` collects the futures)."""

    def __init__(
        self, name: str, sent: list[Sent], held: list[asyncio.Future[None]] | None = None
    ) -> None:
        self.name, self.sent, self.held = name, sent, held

    async def send(
        self,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        partition: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[None]:
        assert headers in (None, HANDLED_HEADERS)
        assert value is not None
        self.sent.append(Sent(self.name, key, value, partition, headers is not None))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.held is None:
            delivery.set_result(None)
        else:
            self.held.append(delivery)
        return delivery


def topics(sent: list[Sent], held: list[asyncio.Future[None]] | None = None) -> dict[str, Any]:
    """Every topic the stages write, in memory."""
    return {name: MemoryTopic(name, sent, held) for name in OUTPUTS}


def sink(
    sent: list[Sent],
    held: list[asyncio.Future[None]] | None = None,
    *,
    max_payload: int = 1 << 20,
    clock: Clock | None = None,
) -> Sink:
    """A sink over memory topics (its metrics and counts its own: ``sink.metrics``,
    ``sink.stats``)."""
    return Sink(
        topics(sent, held),
        codec=CODEC,
        metrics=Metrics(),
        stats=Counter(),
        worker="w1",
        dead_letter_topic="t.trajectories",
        max_payload=max_payload,
        clock=clock or Clock(),
    )


class Recording(MemoryStore):
    """A store that records its writes, as a changelog would (a table writes no tombstone for a
    key it does not hold: :class:`~streams.runtime.live.stores.TableStore`)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bytes]] = []

    def set(self, key: bytes, value: bytes) -> None:
        self.writes.append(("set", key))
        super().set(key, value)

    def delete(self, key: bytes) -> None:
        if self.get(key) is not None:
            self.writes.append(("delete", key))
        super().delete(key)


class Producer:
    """The worker's producer: each flush is recorded in ``log`` (shared with the test)."""

    def __init__(self, log: list[str] | None = None) -> None:
        self.log = log if log is not None else []

    async def flush(self) -> None:
        self.log.append("flush")


class Clock:
    """The stages' clock, moved by the test."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or at(0)

    def __call__(self) -> datetime:
        return self.now


class Monotonic:
    """``time.monotonic`` as the test sets it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Unread:
    """The ledger records a graceful stop reads after the consumer stopped (none unless given)."""

    def __init__(self, records: list[Envelope] | None = None) -> None:
        self.records = records or []

    async def after(self, applied_offset: int) -> list[Envelope]:
        return [r for r in self.records if r.offset > applied_offset]


class Message:
    def __init__(
        self, topic: str, offset: int, key: bytes | None, value: bytes, partition: int = 0
    ) -> None:
        self.topic, self.partition, self.offset, self.key, self.value = (
            topic,
            partition,
            offset,
            key,
            value,
        )
        self.headers: list[tuple[str, bytes]] = []


class Event:
    """A Faust event as the live worker reads it (its ``message``)."""

    def __init__(self, *args: Any, headers: Any = None, **kwargs: Any) -> None:
        self.message = Message(*args, **kwargs)
        if headers:
            self.message.headers = headers


@dataclass
class Worker:
    """A worker composed over memory: its stages, its stores, what it sent, its flushes."""

    stages: Stages
    stores: dict[str, Any]
    sent: list[Sent]
    held: list[asyncio.Future[None]] | None
    clock: Clock
    monotonic: Monotonic
    metrics: Metrics
    stats: Counter[str]
    flushes: list[str] = field(default_factory=list)

    def records(self, topic: str) -> list[Any]:
        return [s.record for s in self.sent if s.topic == topic]


def stages(
    settings: Settings,
    *,
    trinity: Any = None,
    judge_client: Any = None,
    stores: dict[str, Any] | None = None,
    hold_deliveries: bool = False,
    unread: Unread | None = None,
    rules: Rules | None = None,
    flushes: list[str] | None = None,
) -> Worker:
    """The live worker's objects over memory (see the module); the producer's flushes are
    logged in ``flushes``."""
    rules = rules or Rules.of(settings)
    stores = {
        "pending": MemoryStore(),
        "closed": MemoryStore(),
        "awaiting": MemoryStore(),
        "ledger": MemoryStore(),
        "traces": MemoryStore(),
        **({"verdicts": MemoryStore()} if rules.judge is not None else {}),
        **(stores or {}),
    }
    sent: list[Sent] = []
    held: list[asyncio.Future[None]] | None = [] if hold_deliveries else None
    clock, monotonic, metrics, stats = Clock(), Monotonic(), Metrics(), Counter[str]()
    flushes = flushes if flushes is not None else []

    def no_judge() -> JudgeClient:
        raise AssertionError("this test's worker asks no judge")

    composed = compose(
        settings,
        rules,
        codec=CODEC,
        stores=stores,
        topics=topics(sent, held),
        producer=Producer(flushes),
        unread=unread or Unread(),  # type: ignore[arg-type]
        trinity=lambda: trinity,
        judge_client=judge_client or no_judge,
        metrics=metrics,
        stats=stats,
        worker="test-worker",
        clock=clock,
        monotonic=monotonic,
    )
    return Worker(composed, stores, sent, held, clock, monotonic, metrics, stats, flushes)
