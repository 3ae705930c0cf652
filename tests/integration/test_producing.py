"""streams.runtime.producing against the real broker: the worker's Faust producer keeps the
metadata of the topics it writes, not of every topic of the cluster."""

from __future__ import annotations

import faust
import pytest
from aiokafka import AIOKafkaProducer
from faust.transport.drivers import aiokafka as faust_aiokafka

from streams.io.kafka import create_topics
from streams.runtime.producing import TrackingProducer, install_topic_tracking

pytestmark = pytest.mark.integration


async def test_the_workers_producer_keeps_the_metadata_of_the_topics_it_writes(
    kafka_bootstrap: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    written, other = f"{prefix}.written", f"{prefix}.other"
    await create_topics(kafka_bootstrap, {written: 1, other: 1})

    async def metadata_after_a_send(app_id: str) -> tuple[type, set[str]]:
        app = faust.App(app_id, broker=f"kafka://{kafka_bootstrap}")
        producer = app.producer
        await producer.start()
        try:
            # as at a worker's start: Faust creates its changelogs, then refreshes its metadata
            await producer.create_topic(f"{app_id}-changelog", 1, 1)
            await producer.send_and_wait(written, b"k", b"v", None, None, None)
            client = producer._ensure_producer()
            await client.client.force_metadata_update()  # what each later refresh brings
            return type(client), set(client.client.cluster.topics())
        finally:
            await producer.stop()

    # Faust's own: every topic of the cluster, fetched again every refresh
    monkeypatch.setattr(
        faust_aiokafka.Producer, "_producer_type", property(lambda self: AIOKafkaProducer)
    )
    kind, topics = await metadata_after_a_send(f"{prefix}-plain")
    assert kind is AIOKafkaProducer and {written, other} <= topics

    install_topic_tracking()
    kind, topics = await metadata_after_a_send(f"{prefix}-tracking")
    assert kind is TrackingProducer and topics == {written}
