"""The follower of ``<p>.routing``: fills a gateway replica's :class:`~.routing.ShareBook`.

It reads the one partition of the compacted topic from the start (the last change of each
agent at least, and every change since), assigned by hand with no consumer group: every replica
reads everything and commits nothing. :meth:`ShareFollower.start` returns once it has read up
to the end offsets it found (or after ``catch_up_s``, logged), so a replica does not serve its
first call by a share older than the topic's; then it keeps reading in the background. A record
that does not decode as a :class:`~streams.models.RoutingShare` is logged and skipped (the
ledger owner is its only writer; the records are data, never a crash).

May import: :mod:`streams.io`, the codec, the models, :mod:`.routing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition

from ..codec import SchemaRegistry
from ..errors import RecordError
from ..io import kafka
from ..models import RoutingShare
from ..settings import KafkaSecuritySettings
from .routing import ShareBook

__all__ = ["ShareFollower"]

log = logging.getLogger("trajstream.gateway")


class ShareFollower:
    """Read ``topic`` into ``book``; see the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        book: ShareBook,
        *,
        security: KafkaSecuritySettings | None = None,
        codec: SchemaRegistry | None = None,
        catch_up_s: float = 10.0,
        prepare: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.prepare = prepare
        self.bootstrap = bootstrap
        self.topic = topic
        self.book = book
        self.security = security
        self.codec = codec or SchemaRegistry.default()
        self.catch_up_s = catch_up_s
        self.applied = 0
        self._consumer = kafka.consumer(bootstrap, security)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.prepare is not None:
            await self.prepare()  # the topic exists before it is read
        consumer = self._consumer
        await consumer.start()
        tp = TopicPartition(self.topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        try:
            async with asyncio.timeout(self.catch_up_s):
                while await consumer.position(tp) < end:
                    await self._read(timeout_ms=200)
        except TimeoutError:
            log.warning(
                "routing: read %d changes of %s, not yet up to offset %d after %.0f s; "
                "going on in the background",
                self.applied,
                self.topic,
                end,
                self.catch_up_s,
            )
        self._task = asyncio.ensure_future(self._follow())

    async def _read(self, timeout_ms: int) -> None:
        batches = await self._consumer.getmany(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                if not record.value:
                    continue  # a tombstone: an agent's routing forgotten; its last share stays
                try:
                    change = self.codec.decode_as(record.value, RoutingShare)
                except RecordError as exc:
                    log.warning(
                        "routing: offset %d of %s skipped: %s", record.offset, self.topic, exc
                    )
                    continue
                if self.book.apply(change):
                    self.applied += 1
                    log.info(
                        "routing: %s share %.4g from %s (v%d, %s)",
                        change.agent_name,
                        change.share,
                        change.effective_at.isoformat(),
                        change.version,
                        change.action,
                    )

    async def _follow(self) -> None:
        while True:
            try:
                await self._read(timeout_ms=500)
            except asyncio.CancelledError:
                raise
            except Exception:  # the broker away: keep the shares read, try again
                log.exception("routing: reading %s failed; retrying", self.topic)
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()
