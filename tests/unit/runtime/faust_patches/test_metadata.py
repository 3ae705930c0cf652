"""The aiokafka patch (streams/runtime/faust_patches/metadata.py): a failed metadata update
waits the client's retry backoff, and only aiokafka's known synchronizer is replaced."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient

from streams.runtime.faust_patches import metadata


async def test_a_failed_update_waits_the_retry_backoff() -> None:
    """A broker that does not answer: aiokafka's own synchronizer asks again the moment a
    waiting caller asks, so a worker spun near 90 % CPU; patched, it asks once a backoff."""
    loop = asyncio.get_running_loop()
    updates: list[float] = []

    async def metadata_update(cluster: Any, topics: Any) -> bool:
        updates.append(loop.time())
        await asyncio.sleep(0)
        return False  # the broker did not answer

    client = SimpleNamespace(
        _md_update_waiter=loop.create_future(),
        _metadata_max_age_ms=300_000,
        _topics=set(),
        _md_update_fut=None,
        cluster=None,
        _metadata_update=metadata_update,
        _retry_backoff=0.05,
        _loop=loop,
    )

    async def caller() -> None:  # a fetcher that asks for fresh metadata after each failure
        while True:
            await AIOKafkaClient.force_metadata_update(client)  # type: ignore[arg-type]

    tasks = [
        asyncio.create_task(AIOKafkaClient._md_synchronizer(client)),  # type: ignore[arg-type]
        asyncio.create_task(caller()),
    ]
    await asyncio.sleep(0.3)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert 2 <= len(updates) <= 10, f"{len(updates)} updates in 0.3 s with a 0.05 s backoff"


def test_only_the_known_synchronizer_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    original = metadata.AIOKAFKA_SYNCHRONIZER
    installed = AIOKafkaClient._md_synchronizer
    try:
        AIOKafkaClient._md_synchronizer = original  # type: ignore[method-assign]
        monkeypatch.setattr(metadata, "_KNOWN_SYNCHRONIZER", "0" * 64)
        assert not metadata.install_metadata_backoff()
        assert AIOKafkaClient._md_synchronizer is original
        monkeypatch.undo()
        assert metadata.install_metadata_backoff(), "the installed aiokafka is the one it knows"
        assert AIOKafkaClient._md_synchronizer is metadata._md_synchronizer
        assert metadata.install_metadata_backoff()  # once: a second install changes nothing
    finally:
        AIOKafkaClient._md_synchronizer = installed  # type: ignore[method-assign]
