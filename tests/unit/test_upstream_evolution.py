"""Schema evolution of the upstream (issue 22): Trajectory, RewardedTrajectory and WindowSummary
gained ``upstream`` (who answered the call: trinity, production, trinity-shadow; None when no
gateway routed it).

Both directions through the codec's writer-schema registration: a reader of today resolves a
record written before the field (``upstream`` is None), and a reader without the field resolves
a record written today (the field is skipped, the rest is read).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastavro.schema import to_parsing_canonical_form

from streams.codec import SchemaRegistry, schema_dir
from streams.models import AvroModel, RewardedTrajectory, Trajectory, WindowSummary
from tests.unit.factories import sample_records

MODELS_WITH_UPSTREAM = [Trajectory, RewardedTrajectory, WindowSummary]


def registry_without_upstream(tmp_path: Path) -> SchemaRegistry:
    for path in schema_dir().glob("*.avsc"):
        shutil.copy(path, tmp_path / path.name)
    for model in MODELS_WITH_UPSTREAM:
        file = tmp_path / f"{model.avro_name}.avsc"
        schema = json.loads(file.read_text())
        schema["fields"] = [f for f in schema["fields"] if f["name"] != "upstream"]
        file.write_text(json.dumps(schema))
    return SchemaRegistry(tmp_path)


def sample(model: type[AvroModel], upstream: str | None) -> AvroModel:
    record = sample_records()[model]
    return record.model_copy(update={"upstream": upstream})


@pytest.mark.parametrize("model", MODELS_WITH_UPSTREAM, ids=lambda m: m.__name__)
def test_a_reader_without_the_field_reads_a_record_with_upstream(
    tmp_path: Path, model: type[AvroModel]
) -> None:
    old = registry_without_upstream(tmp_path)
    old.register_writer(to_parsing_canonical_form(SchemaRegistry.default().schema_of(model)))
    written = sample(model, "production")
    name, record = old.decode_raw(SchemaRegistry.default().encode(written))
    assert name == model.avro_name
    assert "upstream" not in record
    again = old.decode_as(SchemaRegistry.default().encode(written), model)
    assert again == written.model_copy(update={"upstream": None})


@pytest.mark.parametrize("model", MODELS_WITH_UPSTREAM, ids=lambda m: m.__name__)
def test_a_reader_of_today_reads_a_record_written_before_the_field(
    tmp_path: Path, model: type[AvroModel]
) -> None:
    old = registry_without_upstream(tmp_path)
    new = SchemaRegistry.default()
    new.register_writer(to_parsing_canonical_form(old.schema_of(model)))
    before = sample(model, None)
    again = new.decode_as(old.encode(before), model)
    assert again == before
    assert again.upstream is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("upstream", ["trinity", "production", "trinity-shadow", None])
def test_upstream_round_trips(upstream: str | None) -> None:
    codec = SchemaRegistry.default()
    for model in MODELS_WITH_UPSTREAM:
        record = sample(model, upstream)
        assert codec.decode(codec.encode(record)) == record
