"""The gateway's publisher: a bounded asynchronous buffer in front of the Kafka producer.

The agent never waits for Kafka. :meth:`Publisher.publish` encodes a record and queues it, and
returns at once; a background task sends the queue to the broker in order, and keeps a batch at
the head of the queue until the broker has acknowledged all of it.

Policy past the bound (``gateway.buffer_records``): **spill to disk**. Once the memory queue is
full, records (already encoded) are appended to spill files in ``gateway.spill_dir``, and every
later record follows them there until the spill is drained, so the order is kept: memory first,
then the spill files, oldest first, then memory again. Nothing is dropped while the disk has
room. Spill files left by a stopped or crashed gateway are published first at the next start. A
stop that cannot reach the broker within ``gateway.flush_timeout_s`` spills what is left.

Delivery is at-least-once: a batch that failed part-way is sent again, and the workers count a
repeated ``event_id`` once.

Durability (``gateway.durability``): ``buffered`` answers the agent at once, so what is in memory
when the process is killed (up to ``gateway.buffer_records``) is lost; ``acked`` answers only once
the broker acknowledged the request's records (:meth:`Publisher.acked`): nothing answered is
lost. The queue is one FIFO (memory, then spill, then memory), so a record is on the broker once
the count of acknowledged records reaches its position (:meth:`Publisher.publish` returns it).

An unreachable broker (at start or later) is retried every ``retry_s`` and reported once a
minute (a warning with the buffered and spilled counts) and in :meth:`health`.

Spill file format: frames of ``<u32 topic length><topic><u32 key length><key><u32 value
length><value>`` (big-endian), files named ``spill-<n>.bin``, one per spill episode.

This module imports the codec, the models, the topics and aiokafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from ..codec import SchemaRegistry
from ..models import AgentCall, Completion, UserFeedback
from ..topics import Topics
from .jobs import Job, build_job, job_size

__all__ = ["Publisher", "PublisherStats", "SpillFiles"]

log = logging.getLogger(__name__)

Frame = tuple[str, bytes, bytes]
"""topic, key, value"""
Record = AgentCall | Completion | UserFeedback
Queued = tuple[str, bytes, "bytes | Record | Callable[[], Record]"]
"""topic, key, and the value: encoded, a record, or what builds it (encoded in the background)"""

_LEN = struct.Struct(">I")
_NOTHING: Frame = ("", b"", b"")
"""the place of a record that could not be made: counted, never sent"""
_FIRST_SEGMENT = 10_000_000  # room below for what a stop prepends
WARN_EVERY_S = 60.0
"""An unreachable broker is reported at most this often."""


class SpillFiles:
    """Append-only spill segments on disk, read back oldest first."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._segments = sorted(directory.glob("spill-*.bin"), key=_segment_number)
        self._writer: Any = None
        self._read_offset = 0
        self.records = sum(1 for path in self._segments for _ in _frames(path.read_bytes()))

    def __bool__(self) -> bool:
        return self.records > 0

    def append(self, frame: Frame) -> None:
        if self._writer is None:
            number = _segment_number(self._segments[-1]) + 1 if self._segments else _FIRST_SEGMENT
            path = self.directory / f"spill-{number:08d}.bin"
            self._segments.append(path)
            self._writer = path.open("ab")
        topic, key, value = frame
        t = topic.encode()
        self._writer.write(
            b"".join((_LEN.pack(len(t)), t, _LEN.pack(len(key)), key, _LEN.pack(len(value)), value))
        )
        self._writer.flush()
        self.records += 1

    def peek(self, limit: int) -> list[tuple[Frame, int]]:
        """Up to ``limit`` frames from the oldest segment, each with its end offset."""
        while self._segments:
            oldest = self._segments[0]
            if self._writer is not None and oldest == self._segments[-1]:
                self._writer.flush()
            chunk = 1 << 20
            with oldest.open("rb") as fh:
                while True:
                    fh.seek(self._read_offset)
                    data = fh.read(chunk)
                    out = [
                        (frame, self._read_offset + end)
                        for frame, end in itertools.islice(_frames(data), limit)
                    ]
                    if out or len(data) < chunk:
                        break
                    chunk *= 2  # one frame larger than the chunk
            if out:
                return out
            if self._writer is not None and oldest == self._segments[-1]:
                return []
            # nothing readable left in a closed segment (a torn last frame from a crash)
            self._segments.pop(0)
            oldest.unlink()
            self._read_offset = 0
        return []

    def consume(self, count: int, end_offset: int) -> None:
        """Forget the first ``count`` frames read by :meth:`peek` (they are on the broker)."""
        self.records -= count
        self._read_offset = end_offset
        oldest = self._segments[0]
        if self._read_offset >= oldest.stat().st_size:
            if len(self._segments) == 1 and self._writer is not None:
                self._writer.close()
                self._writer = None
            self._segments.pop(0)
            oldest.unlink()
            self._read_offset = 0

    def seal(self) -> None:
        """Start the next spill in a new segment (called when the spill runs dry)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        self.seal()


def _segment_number(path: Path) -> int:
    return int(path.stem.split("-")[1])


def _frames(data: bytes, offset: int = 0) -> Any:
    n = len(data)
    while offset + 4 <= n:
        parts = []
        for _ in range(3):
            if offset + 4 > n:
                return  # a torn last frame (a crash mid-write): never acknowledged, skipped
            (size,) = _LEN.unpack_from(data, offset)
            offset += 4
            if offset + size > n:
                return  # a torn last frame (a crash mid-write): never acknowledged, skipped
            parts.append(data[offset : offset + size])
            offset += size
        yield (parts[0].decode(), parts[1], parts[2]), offset


@dataclass
class PublisherStats:
    queued: int = 0
    published: int = 0
    spilled: int = 0
    send_failures: int = 0
    unencodable: int = 0
    connected: bool = False

    def to_json(self, buffered: int, spill: int) -> dict[str, Any]:
        return {
            "queued": self.queued,
            "published": self.published,
            "spilled_total": self.spilled,
            "buffered": buffered,
            "spill_records": spill,
            "send_failures": self.send_failures,
            "kafka_connected": self.connected,
        }


ProducerFactory = Callable[[], AIOKafkaProducer]


class Publisher:
    """Queues records for Kafka and publishes them in order in the background."""

    def __init__(
        self,
        producer_factory: ProducerFactory,
        topics: Topics,
        *,
        spill_dir: Path,
        max_buffered: int = 10_000,
        batch: int = 500,
        retry_s: float = 1.0,
        codec: SchemaRegistry | None = None,
        prepare: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._factory = producer_factory
        self._prepare = prepare
        self._prepared = False
        self.topics = topics
        self.codec = codec or SchemaRegistry.default()
        self.max_buffered = max_buffered
        self.batch = batch
        self.retry_s = retry_s
        self.spill = SpillFiles(spill_dir)
        self._memory: deque[Queued] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._producer: AIOKafkaProducer | None = None
        self._stopping = False
        self.stats = PublisherStats()
        self._position = self.spill.records  # records queued so far (a spill left is first)
        self._acked = 0  # records the broker acknowledged, in queue order
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waiter_ids = itertools.count()
        self._warned_at = -math.inf
        self.unreachable_since: float | None = None
        """monotonic time since when the broker cannot be reached (None: reached)"""
        self.last_error: str | None = None
        self.on_advance: Callable[[], None] | None = None
        """called when the broker acknowledged more records (see :attr:`acked_count`)"""

    # -- the agent's side: never waits --------------------------------------------------------

    def publish(self, record: Record) -> int:
        """Queue one record (keyed by its call_id); returns at once, with its position in the
        queue (for :meth:`acked`). It is encoded later, by the background task, in batches:
        not on the agent's time."""
        topic = (
            self.topics.user_feedback
            if isinstance(record, UserFeedback)
            else self.topics.agent_events
        )
        return self._queue((topic, record.call_id.encode(), record))

    def publish_lazy(self, call_id: str, build: Callable[[], AgentCall | Completion]) -> int:
        """Queue the agent event ``build()`` makes, built in the background; see :meth:`publish`.
        A ``build`` that raises is logged and its record dropped."""
        return self._queue((self.topics.agent_events, call_id.encode(), build))

    def publish_encoded(self, topic: str, key: bytes, value: bytes) -> int:
        """Queue one record encoded already; see :meth:`publish`."""
        return self._queue((topic, key, value))

    def publish_job(self, call_id: str, job: Job) -> int:
        """Queue the records ``job`` makes (:mod:`.jobs`), built and encoded in the background
        like :meth:`publish_lazy`'s; returns the position of its last record."""
        built: list[Any] = []  # the records, or what building them raised: built once

        def record(i: int) -> AgentCall | Completion:
            if not built:
                try:
                    built.append(build_job(job))
                except Exception as exc:
                    built.append(exc)
            if isinstance(built[0], Exception):
                raise built[0]
            return built[0][i]  # type: ignore[no-any-return]

        position = self._position
        for i in range(job_size(job)):
            position = self.publish_lazy(call_id, lambda i=i: record(i))  # type: ignore[misc]
        return position

    async def refresh(self) -> None:
        """The counts are always current here (see :class:`.recorder.RecorderProcess`)."""

    def _encoded(self, item: Queued) -> Frame | None:
        topic, key, value = item
        if isinstance(value, bytes):
            return topic, key, value
        try:
            record = value() if callable(value) else value
            return topic, key, self.codec.encode(record)
        except Exception as exc:  # a record the answer could not make: nothing to send
            self.stats.unencodable += 1
            log.warning("a record of call %s could not be made: %s", key.decode(), exc)
            return None

    def _queue(self, item: Queued) -> int:
        self.stats.queued += 1
        if self.spill or len(self._memory) >= self.max_buffered:
            # a record that could not be made keeps its place (positions count it), sent as nothing
            self.spill.append(self._encoded(item) or _NOTHING)
            self.stats.spilled += 1
        else:
            self._memory.append(item)
        self._wake.set()
        self._position += 1
        return self._position

    @property
    def position(self) -> int:
        """The position of the last record queued."""
        return self._position

    def acked(self, position: int) -> asyncio.Future[None]:
        """Done once the broker acknowledged every record up to ``position``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if position <= self._acked:
            future.set_result(None)
        else:
            heapq.heappush(self._waiters, (position, next(self._waiter_ids), future))
        return future

    def handed(self, position: int) -> asyncio.Future[None] | None:
        """What buffered mode waits for before answering (see :meth:`RecorderProcess.handed`):
        nothing here, the queue is this process's own memory."""
        return None

    @property
    def acked_count(self) -> int:
        """How many records, in queue order, the broker acknowledged (a spill left included)."""
        return self._acked

    def _advance(self, count: int) -> None:
        self._acked += count
        if self.on_advance is not None:
            self.on_advance()
        while self._waiters and self._waiters[0][0] <= self._acked:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    def _unreachable(self, exc: BaseException) -> None:
        """Note a failed connection or send; warn at most once a minute."""
        loop_now = time.monotonic()
        if self.unreachable_since is None:
            self.unreachable_since = loop_now
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if loop_now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = loop_now
            log.warning(
                "Kafka not reachable for %.0fs (%s): serving on, %d records buffered in memory, "
                "%d spilled to %s; retrying every %gs",
                loop_now - self.unreachable_since,
                self.last_error,
                len(self._memory),
                self.spill.records,
                self.spill.directory,
                self.retry_s,
            )

    def _reached(self) -> None:
        if self.unreachable_since is not None:
            log.info("Kafka reachable again after %.0fs", time.monotonic() - self.unreachable_since)
        self.unreachable_since = None
        self.last_error = None
        self._warned_at = -math.inf

    @property
    def pending(self) -> int:
        """Records queued and not yet acknowledged by the broker."""
        return len(self._memory) + self.spill.records

    @property
    def buffered(self) -> int:
        return len(self._memory)

    def health(self) -> dict[str, Any]:
        out = self.stats.to_json(len(self._memory), self.spill.records)
        out["unreachable_s"] = (
            round(time.monotonic() - self.unreachable_since, 1)
            if self.unreachable_since is not None
            else None
        )
        out["last_error"] = self.last_error
        return out

    # -- the background side -------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="trajstream-publisher")
        if self.spill:
            log.info(
                "publishing %d spilled records from %s", self.spill.records, self.spill.directory
            )
            self._wake.set()

    async def prepare_now(self) -> None:
        """Run ``prepare`` (e.g. create the topics) now, letting its error through."""
        if self._prepare is not None and not self._prepared:
            await self._prepare()
            self._prepared = True

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued is on the broker; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pending and loop.time() < deadline:
            self._wake.set()
            await asyncio.sleep(0.02)
        return not self.pending

    async def stop(self, timeout: float = 10.0) -> None:
        """Publish what is queued (for up to ``timeout`` s), spill the rest, stop."""
        flushed = await self.flush(timeout)
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not flushed and self._memory:
            log.warning("broker unreachable at stop: spilling %d records", len(self._memory))
            # memory is older than the spill: write it to a segment read before the others
            frames = [self._encoded(item) or _NOTHING for item in self._memory]
            self._memory.clear()
            self._prepend_to_spill(frames)
        self.spill.close()
        await self._close_producer()

    def _prepend_to_spill(self, frames: list[Frame]) -> None:
        older = SpillFiles(self.spill.directory / "older")
        for frame in frames:
            older.append(frame)
        older.close()
        # rename the older frames to the segment before the oldest existing one
        existing = sorted(self.spill.directory.glob("spill-*.bin"), key=_segment_number)
        first = _segment_number(existing[0]) if existing else _FIRST_SEGMENT
        for path in sorted(older.directory.glob("spill-*.bin"), key=_segment_number):
            path.rename(self.spill.directory / f"spill-{first - 1:08d}.bin")
        older.directory.rmdir()

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        self.stats.connected = False
        if producer is not None:  # bounded: a producer that cannot reach the broker may hang
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5.0)

    async def _connect(self) -> AIOKafkaProducer:
        while self._producer is None:
            producer = self._factory()
            try:
                await producer.start()
                if self._prepare is not None and not self._prepared:
                    await self._prepare()  # e.g. create the topics
                    self._prepared = True
            except Exception as exc:  # unreachable broker: keep answering, try again later
                self._unreachable(exc)
                with contextlib.suppress(Exception):
                    await producer.stop()
                await asyncio.sleep(self.retry_s)
                continue
            self._producer = producer
            self.stats.connected = True
            self._reached()
        return self._producer

    async def _run(self) -> None:
        await self._connect()  # early: create the topics, report the broker's state
        while not self._stopping:
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            producer = await self._connect()
            from_spill = not self._memory
            if from_spill:
                peeked = self.spill.peek(self.batch)
                frames = [f for f, _ in peeked]
            else:
                frames = []
                for i in range(min(self.batch, len(self._memory))):
                    frame = self._encoded(self._memory[i])
                    if frame is None:  # keep its place (positions count it), send nothing
                        frame = _NOTHING
                    self._memory[i] = frame  # encoded once, whatever happens to the send
                    frames.append(frame)
            try:
                futures = [await producer.send(t, value=v, key=k) for t, k, v in frames if t]
                await asyncio.gather(*futures)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.send_failures += 1
                self._unreachable(exc)
                await asyncio.sleep(self.retry_s)
                continue
            self._reached()
            self.stats.published += len(frames)
            self._advance(len(frames))
            if from_spill:
                self.spill.consume(len(frames), peeked[-1][1])
                if not self.spill:
                    self.spill.seal()
            else:
                for _ in frames:
                    self._memory.popleft()
