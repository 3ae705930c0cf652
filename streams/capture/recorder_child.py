"""The gateway's recorder process itself (``python -m streams.capture.recorder_child``): reads
what the gateway hands it through its pipe and runs the :class:`~.publisher.Publisher`.

The serving side, the pipe's protocol and the guarantees are :mod:`.recorder`'s; this module is
what runs on the other end of the pipe, and the two things both ends share: the framing
(``<u32 length><pickle>``) and :func:`kafka_publisher`, the publisher of a settings object (the
gateway's in-process recorder builds the same one).

May import: the settings, :mod:`.publisher`, :mod:`streams.io`; and, with a schema registry, the
registry subjects of :mod:`streams.cli_support` (lazily, as the gateway's own producer does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import signal
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..settings import Settings
from ..topics import Topics
from .publisher import Publisher

__all__ = ["FRAME", "PROTOCOL", "create_topics", "kafka_publisher", "main"]

log = logging.getLogger("streams.capture.recorder")

FRAME = struct.Struct(">I")
"""Each frame's length, before its pickle, both ways."""
PROTOCOL = pickle.HIGHEST_PROTOCOL
STATS_EVERY_S = 0.5
"""The child reports its counts at least this often while they change."""


def kafka_publisher(settings: Settings) -> Publisher:
    """The publisher of ``settings``: its producer, topics (created at the first connection),
    spill directory and bound."""
    from ..io import kafka

    bootstrap = settings.bootstrap_servers
    if not bootstrap:
        from ..errors import ConfigError

        raise ConfigError(
            "kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS] is not set"
        )
    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)

    def producer_factory() -> Any:
        return kafka.producer(
            bootstrap,
            settings.kafka.security,
            request_timeout_ms=int(settings.gateway.flush_timeout_s * 1000),
        )

    return Publisher(
        producer_factory,
        topics,
        spill_dir=Path(settings.gateway.spill_dir),
        max_buffered=settings.gateway.buffer_records,
        prepare=create_topics(settings, topics),
    )


def create_topics(settings: Settings, topics: Topics) -> Callable[[], Awaitable[object]]:
    async def prepare() -> None:
        from ..io import kafka

        await kafka.create_topics(
            settings.bootstrap_servers or "",
            topics.all(),
            settings.kafka.replication_factor,
            security=settings.kafka.security,
            configs=topics.configs(),
            min_insync_replicas=settings.kafka.min_insync,
        )

    return prepare


class _Child:
    def __init__(self, publisher: Publisher, out: Any) -> None:
        self.publisher = publisher
        self.out = out
        self._report_scheduled = False
        self._last_report = 0.0

    def send(self, message: tuple[Any, ...]) -> None:
        if self.out.is_closing():  # the gateway is gone: nobody to tell
            return
        data = pickle.dumps(message, PROTOCOL)
        with contextlib.suppress(RuntimeError, ConnectionError):
            self.out.write(FRAME.pack(len(data)) + data)

    def counts(self) -> dict[str, Any]:
        return self.publisher.health()

    def on_advance(self) -> None:
        if not self._report_scheduled:
            self._report_scheduled = True
            asyncio.get_running_loop().call_soon(self._report)

    def _report(self) -> None:
        self._report_scheduled = False
        self._last_report = time.monotonic()
        self.send(("acked", self.publisher.acked_count, self.counts()))

    async def report_now_and_then(self) -> None:
        last: Any = None
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            counts = self.counts()
            counts.pop("unreachable_s", None)
            if counts != last or self.publisher.unreachable_since is not None:
                last = counts
                self._report()


async def _child_main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 30)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout.buffer
    )
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    settings, framing = pickle.loads(await reader.readexactly(size))
    if framing:  # a schema registry: the same wire format as the gateway's own producer
        from ..cli_support import subjects

        topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
        subjects(settings, [topics.agent_events, topics.user_feedback])
    publisher = kafka_publisher(settings)
    child = _Child(publisher, out)
    publisher.on_advance = child.on_advance
    child.send(("hello", publisher.position))
    await publisher.start()
    reporter = asyncio.create_task(child.report_now_and_then())
    timeout = settings.gateway.flush_timeout_s
    try:
        while True:
            try:
                head = await reader.readexactly(FRAME.size)
                (size,) = FRAME.unpack(head)
                items = pickle.loads(await reader.readexactly(size))
            except asyncio.IncompleteReadError:  # the gateway is gone: publish, spill, stop
                log.warning("the gateway closed the recorder's pipe: stopping")
                break
            stop = None
            for item in items:
                kind = item[0]
                if kind == "j":
                    publisher.publish_job(item[1], item[2])
                elif kind == "r":
                    publisher.publish_encoded(item[1], item[2], item[3])
                elif kind == "sync":
                    child.send(("sync", item[1], child.counts()))
                elif kind == "stop":
                    stop = item[1]
            if stop is not None:
                timeout = stop
                break
    finally:
        reporter.cancel()
        await publisher.stop(timeout)
        child.send(("stopped", child.counts()))
        with contextlib.suppress(Exception):
            await out.drain()
            out.close()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway says when to stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        loop_factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_child_main())



if __name__ == "__main__":
    main()
