"""aiokafka's metadata synchroniser (``aiokafka.client.AIOKafkaClient._md_synchronizer``): a
failed metadata update waits the client's retry backoff before the next.

May import: aiokafka, the standard library.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from typing import Any

from aiokafka.client import AIOKafkaClient

__all__ = ["AIOKAFKA_SYNCHRONIZER", "install_metadata_backoff"]

log = logging.getLogger("trajstream")

AIOKAFKA_SYNCHRONIZER = AIOKafkaClient._md_synchronizer
"""aiokafka's own synchronizer (taken at import, before any install)."""

# sha256 of the source of aiokafka.client.AIOKafkaClient._md_synchronizer that this patch
# replaces (aiokafka 0.14.0); another source is left alone
_KNOWN_SYNCHRONIZER = "e0421bffa9a7735a6dbb78b5fcb34628433475ceee32a927bcd5c86d1c4f51ab"


def _synchronizer_digest() -> str:
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
    """Patch aiokafka's metadata synchronizer (once), only if its source is the one this patch
    was read against (aiokafka 0.14.0, by its sha256; any other is left alone and logged);
    whether it is patched.

    Upstream: aiokafka's metadata task asks again the moment a failed request returns, so a
    worker whose broker went away spun near 90 % CPU and logged about 14,000 ERROR lines a
    second ("Unable connect to node ...", measured with a worker on the local broker, the
    broker stopped under it; no upstream issue).

    Fails without it: ``tests/unit/runtime/faust_patches/test_metadata.py::
    test_a_failed_update_waits_the_retry_backoff``.
    """
    current = AIOKafkaClient._md_synchronizer
    if current is _md_synchronizer:
        return True
    if _synchronizer_digest() != _KNOWN_SYNCHRONIZER:
        log.info("aiokafka's metadata synchronizer is not the one this patch knows; not patched")
        return False
    AIOKafkaClient._md_synchronizer = _md_synchronizer
    return True
