"""What a worker keeps of the partitions it hands over at a rebalance: nothing.

Real broker, two real worker processes. Faust's in-memory table store forgets, once a rebalance
has been recovered, the keys of partitions no longer assigned, but only the keys it restored
from a changelog: a key the worker wrote itself stayed in memory for good (in faust-streaming
0.15.3), counted by ``trajstream_open_calls``, and came back as an open call if the partition
returned after its tombstone had been compacted away. Checked from outside, by the open-call
gauges of both workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streams.broker import free_port
from streams.models import AgentCall, CallPhase, ChatMessage
from streams.sdk import TrajstreamProducer

pytestmark = pytest.mark.integration

CALLS = 40


async def _open_calls(client: httpx.AsyncClient, url: str) -> float | None:
    """The worker's ``trajstream_open_calls``; None while it does not answer."""
    try:
        reply = await client.get(f"{url}/metrics")
    except httpx.TransportError:
        return None
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            if sample.name == "trajstream_open_calls":
                return sample.value
    return None


async def _until(what: str, check: Callable[[], Awaitable[object]], timeout: float = 90.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < deadline:
        last = await check()
        if last is True:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what}: not so after {timeout:.0f} s (last: {last})")


async def test_a_worker_forgets_the_open_calls_of_partitions_it_hands_over(
    kafka_bootstrap, prefix, standin, workers
):
    env = {
        "TRAJSTREAM_TRINITY__URL": standin.url,
        "TRAJSTREAM_KAFKA__PARTITIONS": 4,
        "TRAJSTREAM_OBSERVE__HOST": "127.0.0.1",
        "TRAJSTREAM_ASSEMBLY__ABANDON_AFTER_S": 3600,  # nothing closes during the test
        "BROKER_SESSION_TIMEOUT": 10,
    }
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    workers(**env, TRAJSTREAM_OBSERVE__PORT=urls[0].rpartition(":")[2])
    async with httpx.AsyncClient(timeout=5) as client:

        async def first_ready() -> bool:
            try:
                return (await client.get(f"{urls[0]}/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await _until("the first worker ready", first_ready)
        async with TrajstreamProducer(kafka_bootstrap, topic_prefix=prefix) as producer:
            for n in range(CALLS):  # open calls (a START each, no END), keyed over 4 partitions
                await producer.publish(
                    AgentCall(
                        event_id=f"open-{n}/start",
                        call_id=f"open-{n}",
                        phase=CallPhase.START,
                        event_time=datetime.now(UTC),
                        agent_name="researcher",
                        input_messages=[ChatMessage(role="user", content="still thinking")],
                    )
                )

        async def all_open_in_first() -> bool | float | None:
            n = await _open_calls(client, urls[0])
            return n == CALLS or n

        await _until(f"the first worker holding {CALLS} open calls", all_open_in_first)

        workers(**env, TRAJSTREAM_OBSERVE__PORT=urls[1].rpartition(":")[2])

        async def shared() -> bool | tuple[float | None, float | None]:
            first, second = [await _open_calls(client, url) for url in urls]
            if first is None or second is None or not second:
                return first, second
            # each call is held once: by whichever worker has its partition now
            return (first + second == CALLS and first < CALLS) or (first, second)

        await _until("the open calls split between the workers, each held once", shared)
