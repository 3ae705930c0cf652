"""The worker process around Faust: a bounded graceful stop, bounded logs, and metadata retries
that back off, for the hours a broker or Trinity is gone.

What faust-streaming 0.15.3 and aiokafka do on their own when the broker goes away (measured
with a worker on the local broker, the broker stopped under it): aiokafka's metadata task asks
again the moment a failed request returns, so the worker spins near 90 % CPU and logs about
14,000 ERROR lines a second ("Unable connect to node ...", "Failed fetch messages ...");
and SIGTERM is not enough to stop it (the stop waits for the consumer and the producer to
flush to a broker that is not there). Here:

- :func:`install_metadata_backoff`: after a failed metadata update, aiokafka's synchronizer
  waits its client's ``retry_backoff_ms`` before the next one (applied only to the
  synchronizer's source as read in aiokafka 0.14.0; any other is left alone);
- :class:`Repeats`: a logging filter on aiokafka's loggers that lets each distinct message
  through a few times a minute and then says, once a minute, how many it held back;
- :class:`BoundedWorker`: Faust's worker without its terminal spinner (whose handler puts the
  root logger at DEBUG: a log record built for every send, about 4.5 % of a worker's samples
  in an outside profile), and whose stop after SIGTERM or SIGINT is given
  ``stop_timeout_s``; past it the process exits at once (code 1), as a SIGKILL would end it.
  That commits nothing: offsets not committed are read again by the next owner (delivery is
  at-least-once and every effect is idempotent), and a write-ahead commit is resolved by it.

May import: faust, aiokafka, the standard library. Nothing of the core.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import faust

__all__ = ["BoundedWorker", "Repeats", "install_log_limits", "install_metadata_backoff"]

log = logging.getLogger("trajstream")

# sha256 of the source of aiokafka.client.AIOKafkaClient._md_synchronizer that this patch
# replaces (aiokafka 0.14.0); another source is left alone
_KNOWN_SYNCHRONIZER = "e0421bffa9a7735a6dbb78b5fcb34628433475ceee32a927bcd5c86d1c4f51ab"


def _synchronizer_digest() -> str:
    from aiokafka.client import AIOKafkaClient

    source = inspect.getsource(AIOKafkaClient._md_synchronizer)
    return hashlib.sha256(source.encode()).hexdigest()


async def _md_synchronizer(self: Any) -> None:
    """aiokafka's metadata synchronizer, waiting ``retry_backoff`` after a failed update."""
    from aiokafka.util import create_future

    while True:
        await asyncio.wait([self._md_update_waiter], timeout=self._metadata_max_age_ms / 1000)
        topics = self._topics
        if self._md_update_fut is None:
            self._md_update_fut = create_future()
        ret = await self._metadata_update(self.cluster, topics)
        if not ret:
            # the broker did not answer: callers are woken with False as before, but not
            # more often than the client's retry backoff (aiokafka asks again at once)
            await asyncio.sleep(self._retry_backoff)
        if topics != self._topics:
            continue
        self._md_update_waiter = create_future()
        self._md_update_fut.set_result(ret)
        self._md_update_fut = None


def install_metadata_backoff() -> bool:
    """Patch aiokafka's metadata synchronizer (once); whether it is patched."""
    from aiokafka.client import AIOKafkaClient

    current = AIOKafkaClient._md_synchronizer
    if current is _md_synchronizer:
        return True
    if _synchronizer_digest() != _KNOWN_SYNCHRONIZER:
        log.info("aiokafka's metadata synchronizer is not the one this patch knows; not patched")
        return False
    AIOKafkaClient._md_synchronizer = _md_synchronizer  # type: ignore[method-assign]
    return True


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
