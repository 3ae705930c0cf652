"""streams.runtime.faust_patches.producer against the real broker: the worker's Faust producer
keeps the metadata of the topics it writes, not of every topic of the cluster."""

from __future__ import annotations

import faust
import pytest
from aiokafka import AIOKafkaProducer
from faust.transport.drivers import aiokafka as faust_aiokafka

from streams.io.kafka import create_topics
from streams.runtime.faust_patches import producer as producing
from streams.runtime.faust_patches.producer import TrackingProducer, install_topic_tracking

pytestmark = pytest.mark.integration

_FAUST_CREATE_TOPIC = producing._CREATE_TOPIC  # Faust's own, taken before any install


async def test_the_workers_producer_keeps_the_metadata_of_the_topics_it_writes(
    kafka_bootstrap: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    written, other = f"{prefix}.written", f"{prefix}.other"
    await create_topics(kafka_bootstrap, {written: 1, other: 1})

    async def metadata(app_id: str) -> tuple[type, set[str], set[str]]:
        """The producer's class, and its metadata's topics once started, then after a send."""
        app = faust.App(app_id, broker=f"kafka://{kafka_bootstrap}")
        producer = app.producer
        await producer.start()
        try:
            client = producer._ensure_producer()
            # as at a worker's start: Faust creates its changelogs, then refreshes its metadata
            await producer.create_topic(f"{app_id}-changelog", 1, 1)
            await client.client.force_metadata_update()  # what each later refresh brings
            idle = set(client.client.cluster.topics())
            await producer.send_and_wait(written, b"k", b"v", None, None, None)
            await client.client.force_metadata_update()
            return type(client), idle, set(client.client.cluster.topics())
        finally:
            await producer.stop()

    # Faust's own: every topic of the cluster, fetched again every refresh
    monkeypatch.setattr(
        faust_aiokafka.Producer, "_producer_type", property(lambda self: AIOKafkaProducer)
    )
    monkeypatch.setattr(faust_aiokafka.Producer, "create_topic", _FAUST_CREATE_TOPIC)
    kind, idle, busy = await metadata(f"{prefix}-plain")
    assert kind is AIOKafkaProducer and {written, other} <= idle and {written, other} <= busy

    install_topic_tracking()
    changelog = f"{prefix}-tracking-changelog"
    kind, idle, busy = await metadata(f"{prefix}-tracking")
    assert kind is TrackingProducer and idle == {changelog} and busy == {changelog, written}
