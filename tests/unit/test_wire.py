"""Confluent's wire format beside the single-object encoding (streams/wire.py, the codec's
reading of both), the subjects' schemas, and the settings and topics a registry needs.

No registry here: the codec's schema lookup is a plain function over schemas this test makes
(tests/integration/test_registry.py runs a real registry).
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.codec import SchemaRegistry
from streams.errors import ConfigError, DecodeError, TrajstreamError
from streams.models import MODELS, AgentCall, Completion, FeedbackAck, Tick, Trajectory
from streams.settings import load_settings
from streams.topics import Topics
from streams.wire import (
    TopicFraming,
    confluent_prefix,
    read_confluent,
    read_varint,
    zigzag,
)

from .factories import ack, end, start, step, trajectory

TOPICS = Topics("p", 4)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_zigzag_varints_round_trip_as_avro_writes_longs(n: int) -> None:
    encoded = zigzag(n)
    assert read_varint(encoded + b"rest", 0) == (n, len(encoded))
    # the same bytes fastavro writes for a long
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, "long", n)
    assert buf.getvalue() == encoded


def test_a_varint_that_does_not_end_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="does not end"):
        read_varint(b"\xff\xff", 0)


class Lookup:
    """Schema id -> schema text, counting the lookups (a registry answers once per id)."""

    def __init__(self, schemas: dict[int, str]) -> None:
        self.schemas = schemas
        self.asked: list[int] = []

    def __call__(self, schema_id: int) -> str:
        self.asked.append(schema_id)
        if schema_id not in self.schemas:
            raise TrajstreamError(f"schema id {schema_id} not found")
        return self.schemas[schema_id]


def framing_for(codec: SchemaRegistry, ids: dict[str, int]) -> TopicFraming:
    """What streams.io.registry.connect builds from the ids a registry gave."""
    types = TOPICS.value_types()
    prefixes = {}
    for topic, schema_id in ids.items():
        names = types[topic]
        prefixes[topic] = {
            codec.fingerprint_of_name(n): confluent_prefix(schema_id, i if len(names) > 1 else None)
            for i, n in enumerate(names)
        }
    return TopicFraming(prefixes)


@pytest.fixture
def pair() -> tuple[SchemaRegistry, SchemaRegistry, Lookup, TopicFraming]:
    """A writer's codec and framing, and a reader's codec whose lookup knows the schemas."""
    writer, reader = SchemaRegistry(), SchemaRegistry()
    types = TOPICS.value_types()
    ids = {TOPICS.agent_events: 7, TOPICS.trajectories: 8, TOPICS.ledger: 9}
    lookup = Lookup({i: writer.registration_schema(types[t]) for t, i in ids.items()})
    reader.use_schema_lookup(lookup)
    return writer, reader, lookup, framing_for(writer, ids)


@pytest.mark.parametrize(
    ("topic", "record"),
    [
        (TOPICS.agent_events, start()),
        (TOPICS.agent_events, step()),
        (TOPICS.agent_events, end()),
        (TOPICS.trajectories, trajectory()),
        (TOPICS.ledger, ack()),
    ],
    ids=["start", "step", "end", "trajectory", "ack"],
)
def test_every_record_reads_back_from_the_wire_format(pair: Any, topic: str, record: Any) -> None:
    writer, reader, _, framing = pair
    single = writer.encode(record)
    framed = framing.reframe(topic, single)
    assert framed[0] == 0 and read_confluent(framed) in (7, 8, 9)
    assert framed[-len(single) + 10 :] == single[10:], "the same body: a header swap"
    assert reader.decode(framed) == record
    assert reader.decode(single) == record, "and the single-object encoding, as before"


def test_a_union_subject_names_the_record_type_by_its_branch(pair: Any) -> None:
    writer, _, lookup, framing = pair
    schema = fastavro.parse_schema(json.loads(lookup.schemas[7]))
    for record, name in ((start(), AgentCall.avro_name), (step(), Completion.avro_name)):
        framed = framing.reframe(TOPICS.agent_events, writer.encode(record))
        got_name, got = fastavro.schemaless_reader(
            io.BytesIO(framed[5:]), schema, return_record_name=True
        )
        assert got_name == name and got["event_id"] == record.event_id


def test_a_single_type_subject_is_the_record_schema_itself(pair: Any) -> None:
    writer, _, lookup, framing = pair
    schema = json.loads(lookup.schemas[8])
    assert isinstance(schema, dict) and schema["name"] == Trajectory.avro_name
    framed = framing.reframe(TOPICS.trajectories, writer.encode(trajectory()))
    got = fastavro.schemaless_reader(io.BytesIO(framed[5:]), fastavro.parse_schema(schema))
    assert got["trajectory_id"] == trajectory().trajectory_id


def test_each_schema_id_is_looked_up_once(pair: Any) -> None:
    writer, reader, lookup, framing = pair
    for _ in range(3):
        reader.decode(framing.reframe(TOPICS.agent_events, writer.encode(start())))
        reader.decode(framing.reframe(TOPICS.agent_events, writer.encode(step())))
    assert lookup.asked == [7]


def test_a_newer_writer_of_a_union_is_read_by_this_reader() -> None:
    """Another version's producer added an optional field to AgentCall: its union has another
    id, which the reader looks up, and the record resolves against this code's schema."""
    writer, reader = SchemaRegistry(), SchemaRegistry()
    union = json.loads(writer.registration_schema(TOPICS.value_types()[TOPICS.agent_events]))
    union[0]["fields"].append({"name": "tenant", "type": "string", "default": "t0"})
    reader.use_schema_lookup(Lookup({42: json.dumps(union)}))
    parsed = fastavro.parse_schema(union)
    body = io.BytesIO()
    record = (AgentCall.avro_name, end().to_avro() | {"tenant": "acme"})
    fastavro.schemaless_writer(body, parsed, record)
    assert reader.decode(confluent_prefix(42) + body.getvalue()) == end()


def test_unknown_ids_and_a_missing_registry_are_decode_errors(pair: Any) -> None:
    writer, reader, _, framing = pair
    with pytest.raises(DecodeError, match="schema id 99"):
        reader.decode(confluent_prefix(99) + b"\x00")
    framed = framing.reframe(TOPICS.agent_events, writer.encode(start()))
    with pytest.raises(DecodeError, match=r"kafka\.schema_registry\.url"):
        SchemaRegistry().decode(framed)
    with pytest.raises(DecodeError, match="union branch 5"):
        reader.decode(confluent_prefix(7, 5) + b"\x00")


def test_reframing_leaves_what_it_does_not_know(pair: Any) -> None:
    writer, _, _, framing = pair
    tick = writer.encode(Tick(at=start().event_time, source="w"))
    assert framing.reframe(TOPICS.agent_events, tick) == tick, "not a type of agent-events"
    assert framing.reframe("p-pending-changelog", tick) == tick, "changelogs keep theirs"
    framed = framing.reframe(TOPICS.ledger, tick)
    assert framing.reframe(TOPICS.ledger, framed) == framed, "already framed"


def test_every_topic_has_its_record_types_and_the_workers_register_theirs() -> None:
    types = TOPICS.value_types()
    assert set(TOPICS.all()) | {TOPICS.replayed} == set(types)
    names = {m.avro_name for m in MODELS}
    assert all(set(t) <= names for t in types.values())
    assert set(TOPICS.worker_writes()) <= set(types)
    assert FeedbackAck.avro_name in types[TOPICS.ledger]
    codec = SchemaRegistry()
    for topic, record_types in types.items():
        schema = json.loads(codec.registration_schema(record_types))
        fastavro.parse_schema(schema)  # one self-contained schema per subject
        assert isinstance(schema, list) == (len(record_types) > 1), topic


def test_registration_schemas_keep_defaults_and_docs() -> None:
    text = SchemaRegistry().registration_schema([Completion.avro_name])
    schema = json.loads(text)
    assert '"{}"' not in text  # escaped for Apicurio's type detection; the same JSON
    assert any("default" in f for f in schema["fields"]) and "doc" in schema


def test_schema_registry_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__URL", "https://sr.example.com/")
    settings = load_settings()
    assert settings.kafka.schema_registry is not None
    assert settings.kafka.schema_registry.url == "https://sr.example.com"
    assert settings.kafka.schema_registry.framing == "confluent"
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__USERNAME", "u")
    with pytest.raises(ConfigError, match=r"kafka.schema_registry.password .*both"):
        load_settings()
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__PASSWORD", "s3cret-pw")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__BEARER_TOKEN", "tok3n")
    with pytest.raises(ConfigError, match="bearer_token") as refused:
        load_settings()
    assert "tok3n" not in str(refused.value) and "s3cret" not in str(refused.value)
    monkeypatch.delenv("TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__BEARER_TOKEN")
    dumped = load_settings().model_dump(mode="json")["kafka"]["schema_registry"]
    assert dumped["password"] == "**********"
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__URL", "https://u:p@sr.example.com")
    with pytest.raises(ConfigError, match="credentials"):
        load_settings()


def test_min_insync_replicas_defaults_for_the_replication_factor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().kafka.min_insync == 1
    monkeypatch.setenv("TRAJSTREAM_KAFKA__REPLICATION_FACTOR", "3")
    assert load_settings().kafka.min_insync == 2
    monkeypatch.setenv("TRAJSTREAM_KAFKA__MIN_INSYNC_REPLICAS", "3")
    assert load_settings().kafka.min_insync == 3
    monkeypatch.setenv("TRAJSTREAM_KAFKA__MIN_INSYNC_REPLICAS", "4")
    with pytest.raises(ConfigError, match=r"kafka\.min_insync_replicas"):
        load_settings()


async def test_every_producer_is_idempotent_with_acks_all() -> None:
    from streams.io.kafka import PRODUCER_DEFAULTS, producer

    assert PRODUCER_DEFAULTS["acks"] == "all" and PRODUCER_DEFAULTS["enable_idempotence"]
    client = producer("127.0.0.1:9")
    assert client._txn_manager is not None, "aiokafka's idempotent producer"
    framed = producer("127.0.0.1:9", framing=TopicFraming({}))
    assert framed._txn_manager is not None and framed.framing is not None
    # and Faust's, by a patch: tests/unit/runtime/faust_patches/test_producer.py
