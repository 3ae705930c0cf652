"""Schema evolution of the policy's versions and fallbacks (0.4): Trajectory, RewardedTrajectory,
WindowSummary and RoutingShare gained ``policy_version``; Comparison gained ``policy_version``,
``policy_fallbacks``, ``policy_mixed`` and ``fallback_rate``; the ledger's stored state gained
them through its nested WindowAccumulator (``policy_version``) and the Comparisons of its
rollout streaks.

Both directions through the codec's writer-schema registration: a reader of today resolves a
record written before the fields (they take their defaults), and a reader without them resolves
a record written today (they are skipped, the rest is read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastavro.schema import to_parsing_canonical_form

from streams.codec import SchemaRegistry, schema_dir
from streams.models import (
    AvroModel,
    Comparison,
    LedgerState,
    RewardedTrajectory,
    RoutingShare,
    Trajectory,
    WindowSummary,
)
from tests.unit.factories import sample_records

NEW = {
    "policy_version": None,
    "policy_fallbacks": 0,
    "policy_mixed": 0,
    "fallback_rate": None,
}
MODELS = [Trajectory, RewardedTrajectory, WindowSummary, Comparison, RoutingShare, LedgerState]


def _strip(schema: Any) -> Any:
    """The schema without the new fields, in every record it defines inline."""
    if isinstance(schema, list):
        return [_strip(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strip(v) for k, v in schema.items() if k != "fields"}
    if "fields" in schema:
        out["fields"] = [
            {**f, "type": _strip(f["type"])} for f in schema["fields"] if f["name"] not in NEW
        ]
    return out


def registry_before(tmp_path: Path) -> SchemaRegistry:
    """The codec of the version before the fields: every schema file without them."""
    for path in schema_dir().glob("*.avsc"):
        schema = json.loads(path.read_text())
        (tmp_path / path.name).write_text(json.dumps(_strip(schema)))
    return SchemaRegistry(tmp_path)


def without_new(record: AvroModel) -> AvroModel:
    """``record`` as a reader without the fields sees it: every new field at its default,
    nested records too."""
    updates: dict[str, Any] = {k: v for k, v in NEW.items() if k in type(record).model_fields}
    for name in type(record).model_fields:
        value = getattr(record, name)
        if isinstance(value, AvroModel):
            updates[name] = without_new(value)
        elif isinstance(value, list) and value and isinstance(value[0], AvroModel):
            updates[name] = [without_new(v) for v in value]
    return record.model_copy(update=updates)


def test_the_samples_carry_the_new_fields() -> None:
    """Otherwise the tests below could not fail."""
    samples = sample_records()
    for model in MODELS:
        assert without_new(samples[model]) != samples[model], model.__name__


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_a_reader_without_the_fields_reads_a_record_written_today(
    tmp_path: Path, model: type[AvroModel]
) -> None:
    old = registry_before(tmp_path)
    today = SchemaRegistry.default()
    old.register_writer(to_parsing_canonical_form(today.schema_of(model)))
    written = sample_records()[model]
    name, raw = old.decode_raw(today.encode(written))
    assert name == model.avro_name and not set(NEW) & set(raw)
    assert old.decode_as(today.encode(written), model) == without_new(written)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_a_reader_of_today_reads_a_record_written_before_the_fields(
    tmp_path: Path, model: type[AvroModel]
) -> None:
    old = registry_before(tmp_path)
    today = SchemaRegistry.default()
    today.register_writer(to_parsing_canonical_form(old.schema_of(model)))
    before = without_new(sample_records()[model])
    assert today.decode_as(old.encode(before), model) == before


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_the_fields_round_trip(model: type[AvroModel]) -> None:
    codec = SchemaRegistry.default()
    record = sample_records()[model]
    assert codec.decode(codec.encode(record)) == record


def test_a_comparison_of_one_version_round_trips() -> None:
    codec = SchemaRegistry.default()
    record = sample_records()[Comparison].model_copy(update={"span": "version"})
    assert codec.decode(codec.encode(record)) == record
