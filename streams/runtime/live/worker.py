"""The worker process around Faust: a bounded graceful stop and bounded logs for the hours a
broker or Trinity is gone, a stop of its own for a lasting stall, and its memory handed back.

What faust-streaming 0.15.3 and aiokafka do on their own when the broker goes away (measured
with a worker on the local broker, the broker stopped under it): aiokafka's metadata task asks
again the moment a failed request returns, so the worker spins near 90 % CPU and logs about
14,000 ERROR lines a second ("Unable connect to node ...", "Failed fetch messages ...");
and SIGTERM is not enough to stop it (the stop waits for the consumer and the producer to
flush to a broker that is not there). Here:

- after a failed metadata update, aiokafka's synchronizer waits its client's
  ``retry_backoff_ms`` before the next one (a patch of aiokafka:
  :mod:`streams.runtime.faust_patches.metadata`, installed with the others);
- :class:`Repeats`: a logging filter on aiokafka's loggers that lets each distinct message
  through a few times a minute and then says, once a minute, how many it held back;
- :class:`BoundedWorker`: Faust's worker without its terminal spinner (whose handler puts the
  root logger at DEBUG: a log record built for every send, about 4.5 % of a worker's samples
  in an outside profile), and whose stop after SIGTERM or SIGINT is given
  ``stop_timeout_s``; past it the process exits at once (code 1), as a SIGKILL would end it.
  That commits nothing: offsets not committed are read again by the next owner (delivery is
  at-least-once and every effect is idempotent), and a write-ahead commit is resolved by it.
- :func:`exit_on_stall` and :meth:`BoundedWorker.stop_stalled`: a worker whose ``/healthz`` has
  answered 503 (its tables' recovery, or an input partition, stalled: faust-streaming's hangs
  after a rebalance) for ``observe.exit_after_stall_s`` stops itself with :data:`EX_STALLED`,
  so that a restart policy starts it again where no liveness probe watches it (Docker Compose,
  systemd). The watch is a task of its own on the worker's loop: Faust's timers start only
  once the first recovery has finished, which is the hang it must see.
- :func:`install_allocator_limits` and :meth:`BoundedWorker.heap_trimmer`: glibc's malloc set for
  a long-lived process, and the free memory it keeps handed back to the system now and then
  (see :func:`install_allocator_limits` for what was measured).
- :meth:`BoundedWorker.on_startup_finished`: once the app has started, its objects are moved out
  of the collector's generations (:func:`streams.process.keep_out_of_collections`). Measured
  with ``bench/run.py --only pipeline``: a worker draining a backlog ran a full collection about
  every 1.2 s, 55-63 ms each over the ~105,000 objects of the start; 2-4 ms after it, and the
  pipeline drained 2,011-2,106 events/s against 1,770-1,915 (three runs each, in turns).

May import: faust, aiokafka, the standard library, :mod:`streams.process`. Nothing of the core.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import faust

from ...process import keep_out_of_collections

__all__ = [
    "EX_STALLED",
    "BoundedWorker",
    "Repeats",
    "exit_on_stall",
    "install_allocator_limits",
    "install_log_limits",
]

EX_STALLED = 75
"""The worker's exit status after it stopped itself for a lasting stall (EX_TEMPFAIL: try
again; :func:`exit_on_stall`)."""

log = logging.getLogger("trajstream")


class Repeats(logging.Filter):
    """Each distinct message (logger and format string) at most ``burst`` times a ``period``;
    then one summary warning a period, while they keep coming."""

    def __init__(
        self,
        burst: int = 3,
        period: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        summary: logging.Logger | None = None,
    ) -> None:
        super().__init__()
        self.burst, self.period, self.clock = burst, period, clock
        self.summary = summary or log
        self.counts: Counter[tuple[str, str]] = Counter()
        self.held = 0
        self.last = ""
        self.window = clock()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == self.summary.name:
            return True
        with self._lock:
            now = self.clock()
            if now - self.window >= self.period:
                held, last, self.held = self.held, self.last, 0
                self.counts.clear()
                self.window = now
                if held:
                    self.summary.warning(
                        "Kafka client: %d repeated messages held back in the last %ds (the "
                        "broker may be unreachable; the worker keeps retrying); last: %s",
                        held,
                        round(self.period),
                        last,
                    )
            key = (record.name, str(record.msg))
            self.counts[key] += 1
            if self.counts[key] <= self.burst:
                return True
            self.held += 1
            self.last = record.getMessage()
            return False


def install_log_limits(filter_: Repeats | None = None) -> Repeats:
    """Put one :class:`Repeats` on every aiokafka logger (they do not share a handler)."""
    import aiokafka.consumer.fetcher
    import aiokafka.consumer.group_coordinator
    import aiokafka.producer.sender  # noqa: F401

    installed = [f for f in logging.getLogger("aiokafka").filters if isinstance(f, Repeats)]
    filter_ = filter_ or (installed[0] if installed else Repeats())
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] == "aiokafka"]
    for name in ["aiokafka", *names]:
        logger = logging.getLogger(name)
        if not any(isinstance(f, Repeats) for f in logger.filters):
            logger.addFilter(filter_)
    return filter_


# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 * 1024  # glibc's default, made fixed (see install_allocator_limits)
ARENA_MAX = 2  # the event loop's thread and the Kafka consumer's thread
TRIM_EVERY_S = 10.0


def _libc() -> Any | None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.mallopt  # noqa: B018 - glibc, not musl or another libc
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def install_allocator_limits() -> bool:
    """Set glibc's malloc for a long-lived worker, before its threads start; whether it did
    (only with glibc).

    What a worker does to its heap: Kafka fetch responses and the records fetched ahead of
    the agents (thousands while a backlog is drained), producer batches and decoded events
    are short-lived; the stored state (open calls, closed markers) lives for minutes, in
    between. Freed, the short-lived memory stays the process's: glibc raises its mmap
    threshold to the size of each large block freed (up to 32 MiB), so later fetch buffers
    are carved from the heap too, and a heap gives back only its free top. So a worker's RSS
    rose to the high-water mark of its backlogs and stayed (the soak's drift, found with a
    census of the heap: bytes in use went back down, RSS did not). Here: the mmap threshold
    fixed at glibc's default of 128 KiB (large buffers go back to the system when freed), a
    heap's free top given back above the same, two arenas (the event loop's thread and the
    Kafka consumer's; glibc allows eight per core), and :meth:`BoundedWorker.heap_trimmer`
    hands back the free pages inside the heaps every ``TRIM_EVERY_S``.
    """
    libc = _libc()
    if libc is None:
        return False
    ok = all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, MMAP_THRESHOLD),
            (_M_ARENA_MAX, ARENA_MAX),
        )
    )
    return ok


def trim_heap() -> None:
    """Hand the free pages glibc's malloc keeps (inside its heaps, not only at their top) back
    to the system (``malloc_trim(0)``); nothing without glibc."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class BoundedWorker(faust.Worker):
    """Faust's worker with a stop that ends: ``stop_timeout_s`` after SIGTERM (or SIGINT) the
    process exits with code 1 if the graceful stop has not finished."""

    stop_timeout_s: float = 15.0

    def __init__(self, *args: Any, stop_timeout_s: float = 15.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # faust's terminal spinner (on at log level warn and above) puts the root logger at
        # DEBUG, so every send builds a debug record that no handler prints
        self.spinner = None
        self.stop_timeout_s = stop_timeout_s
        self._watchdog: threading.Timer | None = None
        self.exit_status = 0

    async def on_startup_finished(self) -> None:
        """Once the app has started: its objects out of the collector's generations
        (:func:`streams.process.keep_out_of_collections`)."""
        await super().on_startup_finished()
        keep_out_of_collections()

    @faust.Worker.timer(TRIM_EVERY_S)
    async def heap_trimmer(self) -> None:
        """Every TRIM_EVERY_S: the free memory malloc keeps is handed back (:func:`trim_heap`).
        After a backlog is drained, the pages its buffers took among long-lived values stay
        with the process otherwise. A trim blocks the loop for about 10 ms per 100 MiB of
        fragmented heap (measured: 106 ms for 1.2 GiB; a worker's heap is about 50 MiB)."""
        trim_heap()

    def execute_from_commandline(self) -> Any:
        """Faust's, but the process exits with :attr:`exit_status` when one was set (mode's
        worker exits 0 after any stop)."""
        try:
            super().execute_from_commandline()
        except SystemExit as exc:
            if self.exit_status and not exc.code:
                raise SystemExit(self.exit_status) from None
            raise

    def stop_stalled(self, reason: str) -> None:
        """Stop the worker for a lasting stall (:func:`exit_on_stall`): the graceful stop of
        SIGTERM (bounded by ``stop_timeout_s``), then exit status :data:`EX_STALLED`."""
        log.error(
            "stalled for observe.exit_after_stall_s: %s; stopping this worker (exit status %d) "
            "so that whatever runs it starts it again",
            reason,
            EX_STALLED,
        )
        self.exit_status = EX_STALLED
        self._schedule_shutdown(signal.SIGTERM)

    def _schedule_shutdown(self, signal: Any) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Timer(self.stop_timeout_s, self._give_up)
            self._watchdog.daemon = True
            self._watchdog.start()
        super()._schedule_shutdown(signal)

    def _give_up(self) -> None:
        log.error(
            "the graceful stop did not finish in %gs (stop_timeout_s; is Kafka or Trinity "
            "unreachable?): exiting now. Nothing unconfirmed was committed: the next worker "
            "reads again what this one had not committed",
            self.stop_timeout_s,
        )
        for handler in logging.getLogger().handlers:
            try:
                handler.flush()
            except Exception:
                pass
        sys.stderr.flush()
        os._exit(1)


async def exit_on_stall(
    stall_reason: Callable[[], str | None],
    after_s: float,
    stop: Callable[[str], None],
    *,
    every_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> None:
    """Ask ``stall_reason`` every ``every_s`` seconds (``Metrics.stall_reason``: what
    ``/healthz`` answers 503 with); once it has named a stall at every ask for ``after_s``
    seconds, call ``stop`` with the last reason and return. A stall that clears starts the
    count afresh."""
    since: float | None = None
    while True:
        await sleep(every_s)
        reason = stall_reason()
        now = clock()
        if reason is None:
            since = None
            continue
        if since is None:
            since = now
        if now - since >= after_s:
            stop(reason)
            return
