"""Fuzz the input topics of a real worker: it stays up, trains only on what agents published,
keeps its clock, and turns every record it rejects into a dead letter with a reason.

Agents may publish on ``<p>.agent-events`` and ``<p>.user-feedback``; everything else is written
by the deployment's own workers. Hypothesis draws a mix of what can reach the two input topics:
random bytes, bytes that look like Avro single-object encoding, well-formed records of every type
(most of which do not belong there: trajectories and rewards that would inject training data,
clock ticks dated far ahead, acknowledgements, ledger states), events keyed by something other
than their call id or by no key, tombstones (records without a value), and events dated in the
year 2100. Among them run a few honest calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streams.codec import SchemaRegistry
from streams.devtools.traffic import AGENTS, simulate_call
from streams.io.trinity import TrinityClient
from streams.models import (
    AgentCall,
    AvroModel,
    CallPhase,
    ChatMessage,
    Completion,
    DeadLetter,
    SelectionDecision,
    StepKind,
    Tick,
    UserFeedback,
)
from streams.sdk import TrajstreamProducer
from streams.standin import StandIn
from tests.unit.factories import sample_records

from .conftest import read_topic

pytestmark = pytest.mark.integration

FAR = datetime(2100, 1, 1, tzinfo=UTC)
CODEC = SchemaRegistry.default()
SAMPLES = sample_records()
AGENT_TYPES = (AgentCall, Completion)


def _forged(record: AvroModel) -> AvroModel:
    """A record of any type, made to look like it would train on ids nobody served."""
    data = record.model_dump()
    if "msg_ids" in data:
        data["msg_ids"] = ["forged-1", "forged-2"]
    if "response_id" in data:
        data["response_id"] = "forged-3"
    if "rewarded" in data and isinstance(data["rewarded"], dict):
        data["rewarded"]["msg_ids"] = ["forged-4"]
    if isinstance(data.get("steps"), list):
        for i, s in enumerate(data["steps"]):
            s["response_id"] = f"forged-step-{i}"
    if "at" in data and type(record) is Tick:
        data["at"] = FAR
    return type(record).model_validate(data)


keys = st.sampled_from([b"k", b"call-1", b""])  # aiokafka sends no record without both
garbage = st.one_of(
    st.binary(min_size=0, max_size=300).map(lambda b: ("bytes", b, b"k")),
    st.binary(min_size=8, max_size=200).map(lambda b: ("avro-like", b"\xc3\x01" + b, b"k")),
    # a tombstone (a record without a value), keyed or not
    keys.map(lambda k: ("tombstone", None, k)),
    st.tuples(
        st.sampled_from(sorted(SAMPLES, key=lambda t: t.__name__)),
        st.sampled_from([b"call-1", b"call-2", b"", None]),
    ).map(lambda tk: ("record", CODEC.encode(_forged(SAMPLES[tk[0]])), tk[1])),
)


async def _honest_calls(bootstrap: str, prefix: str, standin: StandIn, n: int) -> list:
    rng = random.Random(5)
    agents = list(AGENTS)
    out = []
    async with (
        TrajstreamProducer(bootstrap, topic_prefix=prefix) as producer,
        TrinityClient(standin.url) as trinity,
    ):
        for i in range(n):
            out.append(await simulate_call(producer, trinity, rng, agent=agents[i % len(agents)]))
    return out


async def _open_call(bootstrap: str, prefix: str) -> str:
    """A call that starts and takes a step but does not end during the test."""
    call_id = "open-call-1"
    async with TrajstreamProducer(bootstrap, topic_prefix=prefix) as producer:
        await producer.publish(
            AgentCall(
                event_id=f"{call_id}/start",
                call_id=call_id,
                phase=CallPhase.START,
                event_time=datetime.now(UTC),
                agent_name="researcher",
                input_messages=[ChatMessage(role="user", content="still thinking")],
            )
        )
        await producer.publish(
            Completion(
                event_id=f"{call_id}/0",
                call_id=call_id,
                seq=0,
                event_time=datetime.now(UTC),
                kind=StepKind.TOOL,
                tool_name="search",
            )
        )
    return call_id


class _Loop:
    """An event loop in a thread, so that Hypothesis (which drives plain functions) can run
    each example's Kafka I/O on it while the worker and the stand-in keep running."""

    def __enter__(self) -> _Loop:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self

    def run(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class _Letters:
    """Follows ``<p>.dead-letters`` and remembers where each letter's record came from."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.consumer: AIOKafkaConsumer | None = None
        self.seen: dict[tuple[str, int, int], str] = {}

    async def start(self) -> None:
        self.consumer = AIOKafkaConsumer(
            self.topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest"
        )
        await self.consumer.start()

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()

    async def wait_for(self, wanted: set[tuple[str, int, int]], timeout: float) -> set:
        deadline = time.monotonic() + timeout
        assert self.consumer is not None
        while not wanted <= self.seen.keys() and time.monotonic() < deadline:
            batch = await self.consumer.getmany(timeout_ms=300)
            for msgs in batch.values():
                for m in msgs:
                    d = CODEC.decode(m.value)
                    assert isinstance(d, DeadLetter)
                    self.seen[(d.source_topic, d.source_partition, d.source_offset)] = d.reason
        return wanted - self.seen.keys()


async def _publish(bootstrap: str, items: list[tuple[str, bytes | None, bytes | None]]) -> set:
    """Publish ``(topic, value, key)`` items; the places of those no agent may publish."""
    rejected = set()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for topic, value, key in items:
            meta = await producer.send_and_wait(topic, value, key=key)
            if not _belongs(value, key, topic):
                rejected.add((topic, meta.partition, meta.offset))
    finally:
        await producer.stop()
    return rejected


@pytest.mark.timeout(280)
def test_fuzzed_input_topics(kafka_bootstrap, prefix, workers):
    topics = [f"{prefix}.agent-events", f"{prefix}.user-feedback"]
    with _Loop() as loop:
        standin = StandIn()
        loop.run(standin.start("127.0.0.1", 0))
        letters = _Letters(kafka_bootstrap, f"{prefix}.dead-letters")
        try:
            worker = workers(
                TRAJSTREAM_TRINITY__URL=standin.url,
                TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
                TRAJSTREAM_COMMIT__INTERVAL_S=1,
                TRAJSTREAM_ASSEMBLY__ABANDON_AFTER_S=600,
                TRAJSTREAM_ASSEMBLY__TICK_S=1,
            )
            open_call = loop.run(_open_call(kafka_bootstrap, prefix))
            # the worker creates the topics; the dead-letter consumer needs them
            loop.run(_honest_calls(kafka_bootstrap, prefix, standin, 1))
            loop.run(letters.start())

            # a clock tick from 2100 on both input topics, where no tick belongs, and an
            # honest-looking call dated 2100: no clock may follow them
            future = AgentCall(
                event_id="future/start",
                call_id="future-call",
                phase=CallPhase.START,
                event_time=FAR,
                agent_name="researcher",
            )
            first = [
                (t, CODEC.encode(Tick(at=FAR, source="intruder")), open_call.encode())
                for t in topics
            ]
            first.append((topics[0], CODEC.encode(future), b"future-call"))
            # a tombstone on each input topic, one keyed by an open call, and events without a key
            first += [(topics[0], None, open_call.encode()), (topics[1], None, b"")]
            first += [(t, CODEC.encode(SAMPLES[AgentCall]), None) for t in topics]
            missing = loop.run(letters.wait_for(loop.run(_publish(kafka_bootstrap, first)), 60))
            assert not missing, f"rejected without a dead letter: {missing}"

            @settings(
                max_examples=25,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(batch=st.lists(st.tuples(st.sampled_from(topics), garbage), max_size=6))
            def one_batch(batch):
                items = [(topic, value, key) for topic, (_, value, key) in batch]
                rejected = loop.run(_publish(kafka_bootstrap, items))
                missing = loop.run(letters.wait_for(rejected, 30))
                assert not missing, f"rejected without a dead letter: {missing}"
                assert worker.alive, "a fuzzed record stopped the worker"

            one_batch()

            sims = loop.run(_honest_calls(kafka_bootstrap, prefix, standin, 3))
            honest_ids = {m for s in sims for m in s.msg_ids}
            deadline = time.monotonic() + 120
            while not set(standin.state.trained) >= honest_ids:
                assert time.monotonic() < deadline, "the honest calls were not committed"
                time.sleep(0.5)
            assert worker.alive, "a fuzzed record stopped the worker"

            # nothing reached Trinity that agents did not publish
            sent = {m for f in standin.state.feedback for m in f.body.get("msg_ids", [])}
            forged = {m for m in sent if m.startswith("forged")}
            assert not forged, f"forged msg_ids reached Trinity: {forged}"
            assert sent <= honest_ids | set(standin.state.experiences)

            # the ticks from 2100 moved no clock: the open call is still open
            time.sleep(3)
            decisions = loop.run(read_topic(kafka_bootstrap, f"{prefix}.decisions"))
            closed = {d.call_id for d in decisions if isinstance(d, SelectionDecision)}
            assert open_call not in closed, "a forged tick closed an open call"
        finally:
            with contextlib.suppress(Exception):
                loop.run(letters.stop())
            loop.run(standin.stop())


def _belongs(value: bytes | None, key: bytes | None, topic: str) -> bool:
    """Whether ``value`` is a record an agent may publish on ``topic``, keyed by its call."""
    try:
        record = CODEC.decode(value)
    except Exception:
        return False
    wanted = AGENT_TYPES if topic.endswith(".agent-events") else (UserFeedback,)
    return (
        isinstance(record, wanted)
        and record.call_id.encode() == key
        and record.event_time < datetime(2099, 1, 1, tzinfo=UTC)
    )
