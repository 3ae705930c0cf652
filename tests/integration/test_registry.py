"""A real schema registry (Apicurio Registry, started by the session fixture) with a real broker,
a real worker process and the real stand-in.

* A deployment in the middle of switching: half the calls published in Confluent's wire format
  (an SDK with the registry), half in the single-object encoding (one without); the worker
  (with the registry) makes a trajectory of every call, and writes its topics in the wire
  format, which a generic Confluent reader (confluent-kafka's ``AvroDeserializer``, and
  fastavro with the writer schema fetched from the registry by id) reads without trajstream.
* ``trajstream replay`` reads that mixed history.
* At start: a subject whose compatibility level is weaker than BACKWARD is refused naming the
  subject (exit 2 from the CLI), and a schema change the registry finds incompatible is refused
  with the registry's own message.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import re
import sys
from pathlib import Path
from typing import Any

import fastavro
import httpx
import pytest

from streams.capture.sdk import TrajstreamProducer
from streams.codec import SchemaRegistry
from streams.devtools.traffic import simulate_call
from streams.errors import SchemaRefused
from streams.io.registry import connect, subject_of
from streams.io.trinity import TrinityClient
from streams.models import RewardedTrajectory, Trajectory
from streams.settings import SchemaRegistrySettings
from streams.topics import Topics

from .chaos import read_all
from .conftest import REPO_ROOT, wait_for

# one process runs them all (pytest-xdist, --dist loadgroup): one registry for the run
pytestmark = [pytest.mark.integration, pytest.mark.long, pytest.mark.xdist_group("registry")]
# the registry calls are few and short; plain httpx keeps them readable
# ruff: noqa: ASYNC210

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def registry_env(kafka_bootstrap: str, prefix: str, url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    env.update(
        TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap,
        TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
        TRAJSTREAM_APP_ID=prefix,
        TRAJSTREAM_DATA_DIR=str(tmp_path / "data"),
        TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__URL=url,
        COLUMNS="250",
    )
    return env


async def cli(env: dict[str, str], *args: str, stdin: bytes | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "streams.cli",
        *args,
        env=env,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(120):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def generic_reader(url: str) -> Any:
    """confluent-kafka's own deserializer: what Kafka tools in Python use."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    # a request timeout as a deployment would set one: without it (the client's default) one
    # request that the registry never answered hung a CI run for the test's whole budget; with
    # it, the client retries it (max.retries) on a new connection
    return AvroDeserializer(SchemaRegistryClient({"url": url, "timeout": 10}))


@pytest.mark.timeout(240)
async def test_a_mixed_deployment_through_the_registry_is_readable_by_generic_readers(
    kafka_bootstrap: str, schema_registry: str, prefix: str, standin: Any, workers: Any,
    tmp_path: Path,
) -> None:
    from confluent_kafka.serialization import MessageField, SerializationContext

    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=2,
        TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__URL=schema_registry,
    )
    registry = SchemaRegistrySettings(url=schema_registry)
    rng = random.Random(24)
    codec = SchemaRegistry()  # this test's own: the SDK with the registry teaches it the ids
    async with (
        TrajstreamProducer(
            kafka_bootstrap, topic_prefix=prefix, schema_registry=registry, codec=codec
        ) as confluent,
        TrajstreamProducer(kafka_bootstrap, topic_prefix=prefix) as single_object,
        TrinityClient(standin.url) as trinity,
    ):
        sims = [
            await simulate_call(
                confluent if i % 2 else single_object, trinity, rng, agent="support-bot"
            )
            for i in range(10)
        ]
    topics = Topics(prefix, 4)
    raw_events = await read_all(kafka_bootstrap, topics.agent_events)
    framings = {value[0] for value in raw_events}
    assert framings == {0x00, 0xC3}, "the events are in both encodings"

    wanted = {m for s in sims for m in s.msg_ids}
    await wait_for(
        lambda: set(standin.state.trained) >= wanted, 120, f"{len(wanted)} msg_ids trained"
    )

    # what the worker wrote: the wire format, read without trajstream's codec
    reader = generic_reader(schema_registry)
    for topic, model in ((topics.trajectories, Trajectory), (topics.rewarded, RewardedTrajectory)):
        values = await read_all(kafka_bootstrap, topic)
        assert values and all(v[0] == 0 for v in values), f"{topic}: Confluent's wire format"
        generic = [reader(v, SerializationContext(topic, MessageField.VALUE)) for v in values]
        ours = [codec.decode_as(v, model) for v in values]
        assert [g["call_id"] for g in generic] == [o.call_id for o in ours]
    calls = {s.call_id for s in sims}
    trajectories = await read_all(kafka_bootstrap, topics.trajectories)
    assert {codec.decode_as(v, Trajectory).call_id for v in trajectories} == calls

    # fastavro alone, with the writer schema fetched by the id in the record: the union of
    # agent-events names each record's type
    by_id: dict[int, Any] = {}
    names = set()
    for value in raw_events:
        if value[0] != 0:
            continue
        schema_id = int.from_bytes(value[1:5], "big")
        if schema_id not in by_id:
            text = httpx.get(f"{schema_registry}/schemas/ids/{schema_id}").json()["schema"]
            by_id[schema_id] = fastavro.parse_schema(json.loads(text))
        name, record = fastavro.schemaless_reader(
            io.BytesIO(value[5:]), by_id[schema_id], return_record_name=True
        )
        assert record["call_id"] in calls
        names.add(name)
    assert names == {"io.trajstream.AgentCall", "io.trajstream.Completion"}
    subjects = httpx.get(f"{schema_registry}/subjects").json()
    assert subject_of(topics.agent_events) in subjects
    assert subject_of(topics.trajectories) in subjects

    # a replay reads the history of either encoding
    env = registry_env(kafka_bootstrap, prefix, schema_registry, tmp_path)
    code, out = await cli(env, "replay", "--since", "1h", "--strategy", "sampling:1")
    assert code == 0, out
    found = re.search(r"selected\W+(\d+) of (\d+)", out)
    assert found and found.groups() == ("10", "10"), out


async def test_a_weak_compatibility_level_is_refused_naming_the_subject(
    kafka_bootstrap: str, schema_registry: str, prefix: str, tmp_path: Path
) -> None:
    topics = Topics(prefix, 4)
    subject = subject_of(topics.user_feedback)
    response = httpx.put(
        f"{schema_registry}/config/{subject}",
        json={"compatibility": "NONE"},
        headers={"Content-Type": CONTENT_TYPE},
    )
    assert response.status_code == 200, response.text
    refusal = rf"subject {re.escape(subject)}: compatibility level NONE"
    with pytest.raises(SchemaRefused, match=refusal):
        connect(
            SchemaRegistrySettings(url=schema_registry),
            topics=topics,
            writes=[topics.agent_events, topics.user_feedback],
            codec=SchemaRegistry(),
        )
    events = tmp_path / "events.jsonl"
    events.write_text((REPO_ROOT / "examples" / "events.jsonl").read_text())
    env = registry_env(kafka_bootstrap, prefix, schema_registry, tmp_path)
    code, out = await cli(env, "produce", str(events))
    assert code == 2, out
    assert subject in out and "BACKWARD" in out, out


async def test_an_incompatible_schema_change_is_refused_with_the_registry_message(
    schema_registry: str, prefix: str
) -> None:
    topics = Topics(prefix, 4)
    subject = subject_of(topics.windows)
    # an earlier version of the record that lacked a field this code's schema requires (no
    # default): this code could not read what that version wrote, so BACKWARD refuses it
    ours = json.loads(SchemaRegistry().registration_schema(["io.trajstream.WindowSummary"]))
    required = next(f for f in ours["fields"] if "default" not in f)
    older = {**ours, "fields": [f for f in ours["fields"] if f is not required]}
    response = httpx.post(
        f"{schema_registry}/subjects/{subject}/versions",
        json={"schema": json.dumps(older), "schemaType": "AVRO"},
        headers={"Content-Type": CONTENT_TYPE},
    )
    assert response.status_code == 200, response.text
    with pytest.raises(SchemaRefused) as refused:
        connect(
            SchemaRegistrySettings(url=schema_registry),
            topics=topics,
            writes=[topics.windows],
            codec=SchemaRegistry(),
        )
    message = str(refused.value)
    assert subject in message and "incompatible" in message.lower(), message
    assert required["name"] in message, f"the registry's message names the field: {message}"


@pytest.mark.timeout(180)
async def test_the_gateway_process_writes_the_wire_format(
    kafka_bootstrap: str, schema_registry: str, prefix: str, standin: Any, tmp_path: Path
) -> None:
    """`trajstream gateway` with a registry: its subjects registered at start, its records
    (through its spilling publisher) in Confluent's wire format, readable without trajstream."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    from .cluster_chaos import GatewayProcess, GatewayTraffic

    env = registry_env(kafka_bootstrap, prefix, schema_registry, tmp_path)
    env.update(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_GATEWAY__PRODUCTION_URL=f"{standin.url}/v1",
        TRAJSTREAM_GATEWAY__SPILL_DIR=str(tmp_path / "spill"),
    )
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start()
    try:
        await gateway.ready()
        traffic = GatewayTraffic(gateway.url)
        async with httpx.AsyncClient(timeout=30) as http:
            for i in range(3):
                await traffic._call(http, f"gw-{i}")
        topic = f"{prefix}.agent-events"
        reader = generic_reader(schema_registry)
        values: list[bytes] = []
        for _ in range(40):
            values = await read_all(kafka_bootstrap, topic)
            if len(values) >= 12:  # 3 calls x START, 2 steps, END
                break
            await asyncio.sleep(0.5)
        assert len(values) >= 12 and all(v[0] == 0 for v in values), values[:2]
        context = SerializationContext(topic, MessageField.VALUE)
        seen = {reader(v, context)["call_id"] for v in values}
        assert seen == {"gw-0", "gw-1", "gw-2"}
    except BaseException:
        print(gateway.log.read_text(errors="replace")[-4000:])
        raise
    finally:
        gateway.stop()
