"""streams.io.kafka's topic creation against the real broker: processes that start at the same
moment (two workers of one deployment) each create the topics, none takes a topic that another
is creating for a topic of the wrong size."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import NewTopic

from streams.errors import BrokerError
from streams.io.kafka import admin, create_topics

pytestmark = pytest.mark.integration

PARTITIONS = 4


async def test_workers_starting_together_agree_on_the_topics(
    kafka_bootstrap: str, prefix: str
) -> None:
    wanted = {f"{prefix}.t{i}": PARTITIONS for i in range(12)}
    # eight starters at once, as many replicas of a deployment rolled out together: whoever
    # lists a topic between its creation and its partitions must wait, not refuse to start
    results = await asyncio.gather(
        *(create_topics(kafka_bootstrap, wanted) for _ in range(8)), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    created = [name for r in results if isinstance(r, list) for name in r]
    assert set(created) <= set(wanted)
    client = admin(kafka_bootstrap)
    await client.start()
    try:
        described = await client.describe_topics(list(wanted))
    finally:
        await client.close()
    assert {d["topic"]: len(d["partitions"]) for d in described} == wanted


async def test_a_topic_of_another_size_still_stops_the_start(
    kafka_bootstrap: str, prefix: str
) -> None:
    name = f"{prefix}.agent-events"
    client = admin(kafka_bootstrap)
    await client.start()
    try:
        await client.create_topics([NewTopic(name, 2, 1)])
    finally:
        await client.close()
    with pytest.raises(BrokerError, match=rf"topic {name} has 2 partitions.*kafka.partitions"):
        await create_topics(kafka_bootstrap, {name: PARTITIONS})
