"""The gateway's recorder in its own process: record building, encoding and Kafka off the
serving loop.

``gateway.recorder = "process"`` (the default of ``trajstream gateway``): the serving process
hands what it records to a child process (:mod:`.recorder_child`) through a pipe,
as plain data, batched once per turn of its event loop: a chat request's START and answered step
as jobs (:mod:`.jobs`: the request's and answer's bytes, a few fields), any other record encoded.
The child runs the :class:`~.publisher.Publisher` (memory bound, disk spill, reconnects, the
aiokafka producer) and reports back how many records the broker acknowledged, in queue order,
and its counts. The serving process keeps the positions (:meth:`RecorderProcess.acked`: acked
mode answers once the child reported them; :meth:`RecorderProcess.handed`: buffered mode answers
once they are in the pipe, whose kernel buffer the child still reads after a SIGKILL of the
serving process), so every guarantee of the publisher holds as it did in one process; the pipe
is one FIFO, so the order is kept.

The child ignores SIGINT and SIGTERM (a terminal's Ctrl-C or a service manager reaches the whole
process group): it stops when the gateway tells it (publishing what is queued for up to
``gateway.flush_timeout_s``, spilling the rest), or when the gateway's end of the pipe closes
(the gateway died): then it does the same. A child that dies is started again; what it held in
memory is lost as in a killed gateway, acked requests waiting for it are answered 503.

Wire: frames of ``<u32 length><pickle>`` both ways. Gateway to child: a list of items,
``("r", topic, key, value)`` an encoded record, ``("j", call_id, job)`` a job, ``("sync", n)``,
``("stop", timeout_s)``; the first frame is ``(settings, framing)``. Child to gateway:
``("hello", position)``, ``("acked", count, counts)``, ``("sync", n, counts)``,
``("stopped", counts)``.

May import: the codec, the settings, :mod:`.publisher`, :mod:`.jobs`, :mod:`.recorder_child`,
:mod:`streams.io`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..codec import SchemaRegistry
from ..models import UserFeedback
from ..settings import Settings
from ..topics import Topics
from .jobs import Job, job_size
from .publisher import PublisherStats, Record
from .recorder_child import FRAME, PROTOCOL, create_topics, kafka_publisher

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["RecorderProcess", "create_topics", "kafka_publisher"]

log = logging.getLogger(__name__)

_REPO = str(Path(__file__).resolve().parents[2])
"""on the child's PYTHONPATH: the same code as the gateway's"""


PIPE_BYTES = 1 << 20
"""The pipe to the recorder is widened to this (Linux allows 1 MiB unprivileged): about a
second of records at 1,000 requests/s that the recorder may be behind reading before buffered
answers wait for it, all of it in the kernel, so it outlives a SIGKILL of the serving process."""


def _widen_pipe(pipe: Any) -> None:
    setpipe = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only (None without fcntl)
    if pipe is None or setpipe is None:
        return
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default stays
        fcntl.fcntl(pipe.fileno(), setpipe, PIPE_BYTES)


class _Spill:
    """What the gateway knows of the child's spill (for its metrics)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.records = 0


class RecorderProcess:
    """The serving side of the recorder process; the interface of :class:`.Publisher`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
        self.codec = SchemaRegistry.default()
        self._prepare = create_topics(settings, self.topics)
        self._prepared = False
        self.stats = PublisherStats()
        self.spill = _Spill(Path(settings.gateway.spill_dir))
        self.buffered = 0
        self.unreachable_since: float | None = None
        self.last_error: str | None = None
        self._counts: dict[str, Any] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._outbox: list[tuple[Any, ...]] = []
        self._flush_scheduled = False
        self._offset = 0  # this side's position minus the child's, for the running child
        self._position = 0
        self._acked = 0
        self._lost_upto = 0  # positions a dead child held: never acknowledged
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._hello: asyncio.Future[int] | None = None
        self._stopping = False
        self._stopped: asyncio.Future[None] | None = None
        # positions written into the pipe's kernel buffer (which outlives this process: the
        # child reads it after a SIGKILL of this one), and who waits for them (buffered mode)
        self._handed = 0
        self._written = 0
        self._hand_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._draining: asyncio.Task[None] | None = None

    # -- the serving side: never waits ---------------------------------------------------------

    def publish(self, record: Record) -> int:
        """Queue one record (encoded here; the hot path's records go as jobs)."""
        topic = (
            self.topics.user_feedback
            if isinstance(record, UserFeedback)
            else self.topics.agent_events
        )
        try:
            value = self.codec.encode(record)
        except Exception as exc:  # as the publisher does: logged, dropped, its place kept
            return self._nothing(record.call_id, exc)
        return self._send(("r", topic, record.call_id.encode(), value), 1)

    def publish_lazy(self, call_id: str, build: Callable[[], Record]) -> int:
        """Built here at once (a closure cannot cross to the child); the hot path uses jobs."""
        try:
            record = build()
        except Exception as exc:
            return self._nothing(call_id, exc)
        return self.publish(record)

    def _nothing(self, call_id: str, exc: Exception) -> int:
        log.warning("a record of call %s could not be made: %s", call_id, exc)
        self.stats.unencodable += 1
        return self._send(("j", call_id, ("none", ())), 1)  # its place kept, nothing sent

    def publish_job(self, call_id: str, job: Job) -> int:
        """Queue the records ``job`` makes; built and encoded by the child."""
        return self._send(("j", call_id, job), job_size(job))

    def _send(self, item: tuple[Any, ...], records: int) -> int:
        self._outbox.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_outbox)
        self.stats.queued += records
        self._position += records
        return self._position

    def _flush_outbox(self) -> None:
        self._flush_scheduled = False
        items, self._outbox = self._outbox, []
        if not items:
            return
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            log.error("the recorder process is not running: %d records lost", len(items))
            self._hand_over(self._position)  # nothing to wait for: answered as buffered is
            return
        data = pickle.dumps(items, PROTOCOL)
        proc.stdin.write(FRAME.pack(len(data)) + data)
        self._written = self._position
        if not proc.stdin.transport.get_write_buffer_size():
            self._hand_over(self._written)
        elif self._draining is None:  # the pipe is full: the rest waits in this process
            self._draining = asyncio.get_running_loop().create_task(self._drain(proc.stdin))

    async def _drain(self, stdin: asyncio.StreamWriter) -> None:
        try:
            while stdin.transport.get_write_buffer_size():
                before = self._written
                # the write limits are 0: drain() returns once the buffer was empty, so what
                # was written before it is in the pipe, and all is if it still is empty
                await stdin.drain()
                if stdin.transport.get_write_buffer_size():
                    self._hand_over(before)
                    await asyncio.sleep(0.001)  # written again meanwhile: the pipe is full
                else:
                    self._hand_over(self._written)
        except (ConnectionError, RuntimeError):
            pass  # the child is gone: _read releases the waiters
        finally:
            self._draining = None

    def handed(self, position: int) -> asyncio.Future[None] | None:
        """Buffered mode's wait before an answer: None when the records up to ``position`` are
        in the pipe to the child already (the kernel's buffer: a SIGKILL of this process does
        not lose them), else a future done once they are (the pipe was full: the child is
        behind reading it), or once the child that should have had them died."""
        if position <= self._handed:
            return None
        if self._outbox:  # write it now rather than at the next turn: nothing to wait for
            self._flush_outbox()
            if position <= self._handed:
                return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._hand_waiters, (position, next(self._ids), future))
        return future

    def _hand_over(self, position: int) -> None:
        self._handed = max(self._handed, position)
        waiters = self._hand_waiters
        while waiters and waiters[0][0] <= self._handed:
            _, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(None)

    @property
    def position(self) -> int:
        return self._position

    def acked(self, position: int) -> asyncio.Future[None]:
        """Done once the broker acknowledged every record up to ``position``."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if position <= self._lost_upto and position > self._acked:
            return future  # held by a child that died: never (the request answers 503)
        if position <= self._acked:
            future.set_result(None)
        else:
            heapq.heappush(self._waiters, (position, next(self._ids), future))
        return future

    def _advance(self, acked: int) -> None:
        self._acked = max(self._acked, acked)
        while self._waiters and self._waiters[0][0] <= self._acked:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)

    @property
    def pending(self) -> int:
        """Records queued and not yet acknowledged by the broker."""
        return self._position - self._acked

    def health(self) -> dict[str, Any]:
        out = dict(self._counts)
        out.update(queued=self.stats.queued, recorder="process")
        return out

    async def refresh(self) -> None:
        """Bring the child's counts up to date (everything queued before has reached it)."""
        if self._proc is None or self._proc.returncode is not None:
            return
        n = next(self._ids)
        future = self._syncs[n] = asyncio.get_running_loop().create_future()
        self._send(("sync", n), 0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, 5.0)
        self._syncs.pop(n, None)

    def _take_counts(self, counts: dict[str, Any]) -> None:
        self._counts = counts
        self.buffered = counts["buffered"]
        self.spill.records = counts["spill_records"]
        self.stats.published = counts["published"]
        self.stats.spilled = counts["spilled_total"]
        self.stats.send_failures = counts["send_failures"]
        self.stats.connected = counts["kafka_connected"]
        since = counts["unreachable_s"]
        self.unreachable_since = None if since is None else time.monotonic() - since
        self.last_error = counts["last_error"]

    # -- lifecycle -----------------------------------------------------------------------------

    async def prepare_now(self) -> None:
        """Create the topics now (the child does again at its first connection: idempotent)."""
        if not self._prepared:
            await self._prepare()
            self._prepared = True

    async def start(self) -> None:
        await self._spawn()

    async def _spawn(self) -> None:
        from ..io.kafka import process_framing


        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_REPO, env.get("PYTHONPATH")) if p
        )
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streams.capture.recorder_child",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        assert self._proc.stdin is not None
        # write limits of 0: drain() returns once everything written is in the pipe (handed)
        self._proc.stdin.transport.set_write_buffer_limits(high=0)
        _widen_pipe(self._proc.stdin.transport.get_extra_info("pipe"))
        # what is published from now on goes to this child; what went to a dead one is lost
        began_at = self._lost_upto = max(self._lost_upto, self._position)
        data = pickle.dumps((self.settings, process_framing() is not None), PROTOCOL)
        self._proc.stdin.write(FRAME.pack(len(data)) + data)
        loop = asyncio.get_running_loop()
        self._hello = loop.create_future()
        self._reader = asyncio.create_task(self._read(self._proc), name="trajstream-recorder")
        try:
            position = await asyncio.wait_for(asyncio.shield(self._hello), 120)
        except TimeoutError:
            raise RuntimeError("the recorder process did not start within 120 s") from None
        self._offset = began_at - position

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while True:
                head = await proc.stdout.readexactly(FRAME.size)
                (size,) = FRAME.unpack(head)
                message = pickle.loads(await proc.stdout.readexactly(size))
                kind = message[0]
                if kind == "acked":
                    self._take_counts(message[2])
                    self._advance(self._offset + message[1])
                elif kind == "sync":
                    self._take_counts(message[2])
                    future = self._syncs.get(message[1])
                    if future is not None and not future.done():
                        future.set_result(None)
                elif kind == "hello":
                    if self._hello is not None and not self._hello.done():
                        self._hello.set_result(message[1])
                elif kind == "stopped":
                    self._take_counts(message[1])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        code = await proc.wait()
        if self._stopping:
            return
        log.error(
            "the recorder process exited (code %s): what it held in memory is lost "
            "(%d records not acknowledged); starting it again",
            code,
            self.pending,
        )
        self._lost_upto = self._position
        self._hand_over(self._position)  # buffered: answered, their records died with it
        for _, _, future in self._waiters:  # their records died with it: answered 503
            if not future.done():
                future.cancel()
        self._waiters.clear()
        with contextlib.suppress(Exception):
            await self._spawn()

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued is on the broker; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            await self.refresh()
            if not self.pending:
                return True
            await asyncio.sleep(0.02)
        return not self.pending

    async def stop(self, timeout: float = 10.0) -> None:
        """The child publishes what is queued (for up to ``timeout`` s), spills the rest, stops."""
        self._stopping = True
        proc = self._proc
        if proc is None:
            return
        self._send(("stop", timeout), 0)
        self._flush_outbox()
        try:
            await asyncio.wait_for(proc.wait(), timeout + 30)
        except TimeoutError:
            log.error("the recorder process did not stop: killed")
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)


def main() -> None:
    """The recorder process (kept here for a gateway started before the split): see
    :mod:`.recorder_child`."""
    from .recorder_child import main as child_main

    child_main()


if __name__ == "__main__":
    main()
