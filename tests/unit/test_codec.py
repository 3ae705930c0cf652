"""Unit tests of streams.codec: single-object Avro round trips, the header, errors, evolution."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import parse_schema, to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.codec import MAGIC, SchemaRegistry, named_types, schema_dir, schema_fingerprint
from streams.errors import DecodeError, ValidationError
from streams.models import (
    MODELS,
    AgentCall,
    AvroModel,
    CallPhase,
    CallStatus,
    ChatMessage,
    Completion,
    FeedbackKind,
    StepKind,
    Tick,
    TrainingMark,
    UserFeedback,
)
from tests.unit.factories import T0, end, sample_records, start

SAMPLES = sample_records()
AGENT_CALL_AVSC = schema_dir() / "io.trajstream.AgentCall.avsc"


@pytest.fixture
def registry() -> SchemaRegistry:
    """A registry of its own: register_writer changes it, the process-wide default must not."""
    return SchemaRegistry()


# -- CRC-64-AVRO, straight from the specification, to check the codec against -----------------

_EMPTY = 0xC15D213AA4D7A795
_TABLE = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (_EMPTY & -(_fp & 1))
    _TABLE.append(_fp)


def crc64_avro(data: bytes) -> int:
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def full_schema(raw: dict[str, Any]) -> Any:
    """``raw`` parsed the way another producer would hold it: every named type inlined."""
    named = named_types(schema_dir(), exclude=f"{raw['namespace']}.{raw['name']}")
    return parse_schema(raw, named_schemas=named, expand=True)


def with_header(fingerprint: bytes, schema: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(MAGIC + fingerprint)
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


# -- round trips ------------------------------------------------------------------------------


def test_every_model_has_a_sample() -> None:
    assert set(SAMPLES) == set(MODELS)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_round_trips(model: type[AvroModel]) -> None:
    codec = SchemaRegistry.default()
    record = SAMPLES[model]
    data = codec.encode(record)
    again = codec.decode(data)
    assert type(again) is model
    assert again == record
    assert codec.decode_as(data, model) == record
    assert codec.encode(again) == data  # encoding is deterministic


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_header_is_magic_and_little_endian_crc64_of_canonical_form(model: type[AvroModel]) -> None:
    codec = SchemaRegistry.default()
    data = codec.encode(SAMPLES[model])
    canonical = to_parsing_canonical_form(codec.schema_of(model)).encode()
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == crc64_avro(canonical).to_bytes(8, "little")
    assert data[2:10] == codec.fingerprint_of(model)


def test_fingerprint_of_null_is_the_spec_vector() -> None:
    expected = bytes([0x8A, 0x8F, 0x25, 0xCC, 0xE7, 0x24, 0xDD, 0x63])
    assert schema_fingerprint(fastavro.parse_schema("null")) == expected
    assert crc64_avro(b'"null"').to_bytes(8, "little") == expected


def test_fingerprints_differ_between_models() -> None:
    codec = SchemaRegistry.default()
    assert len({codec.fingerprint_of(m) for m in MODELS}) == len(MODELS)


def test_timestamps_come_back_as_utc_at_millisecond_precision() -> None:
    codec = SchemaRegistry.default()
    paris = timezone(timedelta(hours=1))
    tick = Tick(at=datetime(2026, 1, 1, 1, 0, 0, 123456, tzinfo=paris))
    again = codec.decode_as(codec.encode(tick), Tick)
    assert again.at == datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)
    assert again.at.utcoffset() == timedelta(0)


# -- property-based round trips ---------------------------------------------------------------

texts = st.text(max_size=30)
ids = st.text(min_size=1, max_size=40)
maybe_text = st.none() | texts


def minutes(n: int) -> timedelta:
    return timedelta(minutes=n)


# hypothesis takes naive bounds and attaches the generated timezone
LOW, HIGH = datetime(1900, 1, 2), datetime(2300, 1, 1)  # noqa: DTZ001
utc_ms = st.datetimes(min_value=LOW, max_value=HIGH, timezones=st.just(UTC)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
)
any_offset = st.datetimes(
    min_value=LOW,
    max_value=HIGH,
    timezones=st.builds(timezone, st.integers(-14 * 60, 14 * 60).map(minutes)),
)
messages = st.lists(st.builds(ChatMessage, role=ids, content=texts, name=maybe_text), max_size=3)
int32 = st.integers(0, 2**31 - 1)
int64 = st.integers(0, 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
marks = st.builds(
    TrainingMark,
    labels=st.lists(texts, max_size=3),
    metadata=st.dictionaries(texts, texts, max_size=3),
    task_id=st.none() | st.text(min_size=1, max_size=64),
    run_id=st.none() | int32,
    marked_at=utc_ms,
)

agent_calls = st.builds(
    AgentCall,
    event_id=ids,
    call_id=ids,
    phase=st.sampled_from(CallPhase),
    event_time=any_offset,
    operation_name=texts,
    agent_id=maybe_text,
    agent_name=maybe_text,
    agent_version=maybe_text,
    conversation_id=maybe_text,
    input_messages=messages,
    output=maybe_text,
    status=st.none() | st.sampled_from(CallStatus),
    error_type=maybe_text,
    step_count=st.none() | int32,
    mark=st.none() | marks,
    attributes=st.dictionaries(texts, texts, max_size=4),
)
completions = st.builds(
    Completion,
    event_id=ids,
    call_id=ids,
    seq=int32,
    event_time=utc_ms,
    kind=st.sampled_from(StepKind),
    operation_name=texts,
    provider_name=maybe_text,
    request_model=maybe_text,
    response_model=maybe_text,
    response_id=maybe_text,
    finish_reasons=st.lists(texts, max_size=3),
    input_tokens=st.none() | int64,
    output_tokens=st.none() | int64,
    input_messages=messages,
    output_messages=messages,
    tool_name=maybe_text,
    tool_calls=st.lists(texts, max_size=3),
    latency_ms=st.none() | st.floats(min_value=0, allow_nan=False),
)

@st.composite
def _scale(draw: st.DrawFn) -> tuple[float | None, float, float]:
    """A rating on its scale (rating_min < rating_max, the rating between them) or none."""
    lo = draw(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
    hi = draw(st.floats(min_value=lo, max_value=2e6, allow_nan=False, exclude_min=True))
    rating = draw(st.none() | st.floats(min_value=lo, max_value=hi, allow_nan=False))
    return rating, lo, hi


feedbacks = _scale().flatmap(lambda scale: st.builds(
    UserFeedback,
    event_id=ids,
    call_id=ids,
    response_id=maybe_text,
    event_time=utc_ms,
    kind=st.sampled_from(FeedbackKind),
    rating=st.just(scale[0]),
    rating_min=st.just(scale[1]),
    rating_max=st.just(scale[2]),
    thumbs_up=st.none() | st.booleans(),
    correction=maybe_text,
    preferred_response_id=maybe_text,
    user_id=maybe_text,
    comment=maybe_text,
))


@settings(max_examples=150, deadline=None)
@given(record=st.one_of(agent_calls, completions, feedbacks))
def test_generated_events_round_trip(record: AvroModel) -> None:
    codec = SchemaRegistry.default()
    again = codec.decode(codec.encode(record))
    assert type(again) is type(record)
    assert again == record
    assert again.model_dump() == record.model_dump()


@settings(max_examples=50, deadline=None)
@given(when=any_offset)
def test_generated_timestamps_survive_as_utc_ms(when: datetime) -> None:
    codec = SchemaRegistry.default()
    again = codec.decode_as(codec.encode(Tick(at=when)), Tick).at
    assert again.tzinfo is not None and again.utcoffset() == timedelta(0)
    assert timedelta(0) <= when - again < timedelta(milliseconds=1)


# -- errors ----------------------------------------------------------------------------------


def _good() -> bytes:
    return SchemaRegistry.default().encode(end(output="a longer output", attributes={"k": "v"}))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "empty record"),
        (None, "empty record"),  # a tombstone, as a Kafka client hands it over
        (b"\xc3", "C3 01"),
        (b"\xc3\x01\x00\x01", "C3 01"),  # header cut short
        (b"\xc3\x02" + _good()[2:], "C3 01"),
        # magic byte 0 is Confluent's wire format: without a registry, named as a setting
        (b"\x00\x00" + _good()[2:], "kafka.schema_registry.url"),
        (b'{"event_id": "e1"}', "C3 01"),
        (MAGIC + bytes(8) + b"\x00", "unknown writer schema fingerprint 0000000000000000"),
        (_good()[:-1], "corrupt io.trajstream.AgentCall body"),
        (_good()[:12], "corrupt io.trajstream.AgentCall body"),
        (_good()[:10], "corrupt io.trajstream.AgentCall body"),
    ],
    ids=[
        "empty",
        "tombstone",
        "one-byte",
        "short-header",
        "wrong-magic-version",
        "no-magic",
        "json",
        "unknown-fingerprint",
        "truncated-last-byte",
        "truncated-early",
        "header-only",
    ],
)
def test_undecodable_bytes_are_decode_errors(data: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        SchemaRegistry.default().decode(data)


def test_every_truncation_of_a_body_is_a_decode_error() -> None:
    codec = SchemaRegistry.default()
    data = codec.encode(SAMPLES[AgentCall])
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(data[:cut])


def test_trailing_bytes_after_the_record_are_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        SchemaRegistry.default().decode(_good() + b"\x00garbage")


def test_non_bytes_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="expected bytes, got str"):
        SchemaRegistry.default().decode("\xc3\x01abc")  # type: ignore[arg-type]


def test_bytearray_and_memoryview_are_accepted() -> None:
    codec = SchemaRegistry.default()
    data = codec.encode(start())
    assert codec.decode(bytearray(data)) == start()  # type: ignore[arg-type]
    assert codec.decode(memoryview(data)) == start()  # type: ignore[arg-type]


def test_decode_as_the_wrong_model_is_a_decode_error() -> None:
    codec = SchemaRegistry.default()
    expected = r"expected io\.trajstream\.Completion, got io\.trajstream\.AgentCall"
    with pytest.raises(DecodeError, match=expected):
        codec.decode_as(codec.encode(start()), Completion)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"call_id": ""}, "call_id"),
        ({"event_id": ""}, "event_id"),
        ({"step_count": -1}, "step_count"),
        (
            {
                "mark": {
                    "labels": [],
                    "metadata": {},
                    "task_id": "x" * 65,
                    "run_id": None,
                    "marked_at": T0,
                }
            },
            "mark.task_id",
        ),
    ],
    ids=["empty-call-id", "empty-event-id", "negative-step-count", "long-task-id"],
)
def test_decodable_record_that_breaks_the_model_is_a_validation_error(
    change: dict[str, Any], match: str
) -> None:
    codec = SchemaRegistry.default()
    record = end().to_avro() | change
    data = codec.encode_with(codec.schema_of(AgentCall), record)
    with pytest.raises(ValidationError, match=f"invalid io.trajstream.AgentCall: {match}"):
        codec.decode(data)


def test_validation_error_message_is_bounded() -> None:
    codec = SchemaRegistry.default()
    record = SAMPLES[Completion].to_avro() | {
        "event_id": "",
        "call_id": "",
        "seq": -1,
        "input_tokens": -1,
        "output_tokens": -1,
        "latency_ms": -1.0,
        "input_messages": [{"role": "", "content": "", "name": None}],
    }
    with pytest.raises(ValidationError, match="and 2 more") as info:
        codec.decode(codec.encode_with(codec.schema_of(Completion), record))
    assert isinstance(info.value.__cause__, Exception)


# -- schema evolution ------------------------------------------------------------------------


def _raw_agent_call() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(AGENT_CALL_AVSC.read_text())
    return raw


def _newer() -> dict[str, Any]:
    raw = _raw_agent_call()
    raw["fields"].append(
        {"name": "tenant", "type": "string", "default": "default", "doc": "added in v2"}
    )
    return raw


def _older() -> dict[str, Any]:
    raw = _raw_agent_call()
    raw["fields"] = [f for f in raw["fields"] if f["name"] != "attributes"]
    return raw


def test_newer_writer_schema_is_read_by_the_current_reader(registry: SchemaRegistry) -> None:
    fp = registry.register_writer(_newer())
    record = end().to_avro() | {"tenant": "acme", "attributes": {"a": "b"}}
    # body written with the newer schema, header with the fingerprint the registry knows it by
    decoded = registry.decode(with_header(fp, full_schema(_newer()), record))
    assert decoded == end(attributes={"a": "b"})
    assert "tenant" not in decoded.model_dump()


def test_newer_writer_schema_can_be_registered_as_json_text(registry: SchemaRegistry) -> None:
    fp = registry.register_writer(json.dumps(_newer()))
    record = start().to_avro() | {"tenant": "acme"}
    assert registry.decode(with_header(fp, full_schema(_newer()), record)) == start()


def test_older_writer_schema_gets_the_readers_default(registry: SchemaRegistry) -> None:
    fp = registry.register_writer(_older())
    record = {k: v for k, v in end().to_avro().items() if k != "attributes"}
    decoded = registry.decode_as(with_header(fp, full_schema(_older()), record), AgentCall)
    assert decoded.attributes == {}
    assert decoded == end()


def test_unregistered_newer_schema_is_a_decode_error_naming_the_fingerprint(
    registry: SchemaRegistry,
) -> None:
    schema = full_schema(_newer())
    data = registry.encode_with(schema, end().to_avro() | {"tenant": "acme"})
    fp = schema_fingerprint(schema).hex()
    with pytest.raises(DecodeError, match=f"unknown writer schema fingerprint {fp}"):
        registry.decode(data)


def test_register_writer_leaves_the_current_schema_in_charge(registry: SchemaRegistry) -> None:
    before = registry.encode(end())
    registry.register_writer(_newer())
    assert registry.encode(end()) == before
    assert registry.decode(before) == end()


def test_register_writer_fingerprint_is_the_standard_fingerprint(registry: SchemaRegistry) -> None:
    assert registry.register_writer(_raw_agent_call()) == registry.fingerprint_of(AgentCall)
    # and so a newer producer's records decode once its schema is registered
    schema = full_schema(_newer())
    registry.register_writer(_newer())
    assert registry.decode(registry.encode_with(schema, end().to_avro() | {"tenant": "t"})) == end()


def test_registry_from_a_directory_of_schemas(tmp_path: Path) -> None:
    for path in schema_dir().glob("*.avsc"):
        (tmp_path / path.name).write_text(path.read_text())
    codec = SchemaRegistry(tmp_path)
    assert codec.decode(SchemaRegistry.default().encode(SAMPLES[AgentCall])) == SAMPLES[AgentCall]


# -- the released versions' writer schemas ------------------------------------------------------

REPOSITORY = Path(__file__).resolve().parents[2]
RELEASES = sorted((schema_dir() / "released").glob("*.json"))


def test_every_release_in_the_changelog_keeps_its_writer_schemas() -> None:
    changelog = (REPOSITORY / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - ", changelog, re.MULTILINE)
    assert versions, "no release in CHANGELOG.md"
    missing = [v for v in versions if not (schema_dir() / "released" / f"{v}.json").is_file()]
    assert not missing, (
        f"releases without schemas/released/<version>.json: {missing}; a release keeps its "
        "writer schemas (CONTRIBUTING.md, Releasing): "
        "python -c 'from streams.codec import write_released; write_released(\"X.Y.Z\")'"
    )


@pytest.mark.parametrize("release", RELEASES, ids=lambda p: p.stem)
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_a_record_a_released_version_wrote_is_read_today(
    release: Path, model: type[AvroModel]
) -> None:
    """Records on the topics and in the tables' changelogs outlive an upgrade: what a released
    version wrote (its writer schema, its fingerprint) decodes with this code's schemas, the
    fields added since taking their defaults."""
    entry = json.loads(release.read_text())["records"].get(model.avro_name)
    if entry is None:
        pytest.skip(f"{model.avro_name} is newer than {release.stem}")
    writer = parse_schema(json.loads(entry["schema"]))
    assert schema_fingerprint(writer).hex() == entry["fingerprint"]
    codec = SchemaRegistry.default()
    today = parse_schema(json.loads(to_parsing_canonical_form(codec.schema_of(model))))
    body = io.BytesIO(codec.encode(SAMPLES[model])[len(MAGIC) + 8 :])
    values = fastavro.schemaless_reader(body, today)  # plain values: no logical types
    data = with_header(bytes.fromhex(entry["fingerprint"]), writer, values)
    again = codec.decode_as(data, model)

    def as_released(record: AvroModel) -> Any:
        """The record as the release knows it: every field it had, at any depth."""
        body = io.BytesIO(codec.encode(record)[len(MAGIC) + 8 :])
        return fastavro.schemaless_reader(body, today, writer)

    assert as_released(again) == as_released(SAMPLES[model])


def test_a_writer_schema_no_release_knows_is_still_a_decode_error() -> None:
    raw = json.loads(AGENT_CALL_AVSC.read_text())
    raw["fields"].append({"name": "from_the_future", "type": ["null", "string"], "default": None})
    newer = full_schema(raw)
    record = {**SchemaRegistry.default().decode_raw(SchemaRegistry.default().encode(start()))[1]}
    record["event_time"] = int(T0.timestamp() * 1000)
    data = with_header(schema_fingerprint(newer), newer, record)
    with pytest.raises(DecodeError, match="unknown writer schema fingerprint"):
        SchemaRegistry.default().decode(data)
