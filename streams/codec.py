"""Avro single-object encoding of every record that crosses Kafka.

Each Kafka value is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema's canonical form + the Avro binary body (the Avro specification's "single object
encoding"). The fingerprint tells a reader which schema wrote the bytes, so one topic can carry
several record types (the agent-events topic carries AgentCall and Completion) and a reader can
resolve an older or newer writer schema against its own (Avro schema resolution).

The registry loads ``schemas/<namespace>.<Name>.avsc`` with fastavro. It also knows the writer
schemas of trajstream's released versions (``schemas/released/<version>.json``, written at each
release by :func:`write_released`), so that records and stored state written by an earlier
release decode here, resolved by Avro's rules. Other writer schemas are added with
:meth:`SchemaRegistry.register_writer`; a record written with a schema the registry does not
know is a :class:`~streams.errors.DecodeError` (it goes to the dead-letter topic and can be
replayed once the schema is known), never a guess.

Records in Confluent's wire format (written when ``kafka.schema_registry`` is set; the layouts
in :mod:`streams.wire`) are read too: the schema id is looked up once through the callable
given to :meth:`SchemaRegistry.use_schema_lookup` (the registry client of
:mod:`streams.io.registry`) and cached, and a union schema's branch index picks the record
type. So every reader takes both encodings. :meth:`SchemaRegistry.encode` always writes the
single-object encoding (the tables' changelogs keep it); the writers to topics put the wire
format's header in front of it (:class:`streams.wire.TopicFraming`).

Example::

    codec = SchemaRegistry.default()
    data = codec.encode(call)            # bytes for Kafka
    again = codec.decode(data)           # the same AgentCall

May import: fastavro, pydantic, :mod:`streams.models`, :mod:`streams.wire`, :mod:`streams.errors`.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import fastavro
import pydantic
from fastavro.schema import fingerprint, load_schema, parse_schema, to_parsing_canonical_form

from . import wire
from .errors import DecodeError, ValidationError
from .models import MODELS, AvroModel

__all__ = [
    "MAGIC",
    "RELEASED",
    "SchemaRegistry",
    "named_types",
    "released_schemas",
    "schema_dir",
    "schema_fingerprint",
    "write_released",
]

MAGIC = b"\xc3\x01"
_HEADER = len(MAGIC) + 8

RELEASED = "released"
"""The directory, beside the ``.avsc`` files, of the released versions' writer schemas."""

M = TypeVar("M", bound=AvroModel)


def schema_dir() -> Path:
    """Where the ``.avsc`` files are: the repository's ``schemas/`` or the installed copy."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "schemas", here / "_schemas"):
        if candidate.is_dir() and any(candidate.glob("*.avsc")):
            return candidate
    raise FileNotFoundError(f"no Avro schemas found next to {here}")


def schema_fingerprint(parsed: Any) -> bytes:
    """CRC-64-AVRO fingerprint of a parsed schema, as the 8 little-endian header bytes."""
    # fastavro prints the fingerprint's bytes in little-endian order, which is exactly the
    # order the single-object header wants (checked against the spec's "null" vector in tests).
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


class _Writer:
    __slots__ = ("fingerprint", "model", "name", "schema")

    def __init__(self, name: str, schema: Any, model: type[AvroModel] | None):
        self.name = name
        self.schema = schema
        self.model = model
        self.fingerprint = schema_fingerprint(schema)


class SchemaRegistry:
    """Encodes models to single-object Avro and decodes bytes back to models."""

    def __init__(self, directory: Path | None = None, models: Iterable[type[AvroModel]] = MODELS):
        self.directory = directory or schema_dir()
        self._by_model: dict[type[AvroModel], _Writer] = {}
        self._by_fingerprint: dict[bytes, _Writer] = {}
        # reader schemas by full name: what this version of the code reads into
        self._readers: dict[str, Any] = {}
        for model in models:
            # each schema is loaded on its own: fastavro mutates the named types it shares
            path = self.directory / f"{model.avro_name}.avsc"
            parsed = load_schema(str(path), _write_hint=True)
            writer = _Writer(model.avro_name, parsed, model)
            self._by_model[model] = writer
            self._by_fingerprint[writer.fingerprint] = writer
            self._readers[model.avro_name] = parsed
        self._model_of: dict[str, type[AvroModel]] = {m.avro_name: m for m in self._by_model}
        # Confluent's wire format: schema id -> the fingerprints of its record(s) (a union
        # schema has one per branch), learnt through the lookup (schema id -> schema text)
        self._by_schema_id: dict[int, tuple[bytes, ...]] = {}
        self._schema_lookup: Callable[[int], str] | None = None
        self._learn_released(self.directory / RELEASED)

    @classmethod
    def default(cls) -> SchemaRegistry:
        """The registry of the schemas shipped with the package (built once per process)."""
        return _default_registry()

    def schema_of(self, model: type[AvroModel]) -> Any:
        return self._by_model[model].schema

    def fingerprint_of(self, model: type[AvroModel]) -> bytes:
        return self._by_model[model].fingerprint

    def fingerprint_of_name(self, name: str) -> bytes:
        """The fingerprint of this code's schema of the record ``name`` (Avro full name)."""
        return self.fingerprint_of(self._model_of[name])

    def register_writer(self, schema: dict[str, Any] | str) -> bytes:
        """Teach the registry another version of a record's schema (e.g. from a newer producer).

        Records written with it are then resolved against this code's reader schema of the same
        full name. Returns the schema's fingerprint.
        """
        raw = json.loads(schema) if isinstance(schema, str) else schema
        named = named_types(self.directory, exclude=_full_name(raw))
        # expand: the fingerprint is of the full canonical form, with named types inlined
        return self._add_writer(parse_schema(raw, named_schemas=named, expand=True))

    def _learn_released(self, where: Path) -> None:
        """The writer schemas of the released versions whose fingerprints this code lacks (a
        record type that changed since). Each is a parsing canonical form: self-contained, so
        it is parsed without this code's named types."""
        if not where.is_dir():
            return
        for path in sorted(where.glob("*.json")):
            for entry in json.loads(path.read_text())["records"].values():
                if bytes.fromhex(entry["fingerprint"]) not in self._by_fingerprint:
                    self._add_writer(parse_schema(json.loads(entry["schema"]), expand=True))

    def _add_writer(self, expanded: Any) -> bytes:
        parsed: dict[str, Any] = _define_once(expanded, set())
        name = str(parsed["name"])
        model = next((m for m in self._by_model if m.avro_name == name), None)
        writer = _Writer(name, parsed, model)
        self._by_fingerprint.setdefault(writer.fingerprint, writer)
        return writer.fingerprint

    def use_schema_lookup(self, lookup: Callable[[int], str] | None) -> None:
        """Read Confluent's wire format: ``lookup`` gives the schema text of a schema id (it
        may raise :class:`~streams.errors.TrajstreamError`; that record is then a
        DecodeError). None: such records are refused, naming the missing setting."""
        self._schema_lookup = lookup

    def registration_schema(self, names: Sequence[str]) -> str:
        """The schema to register for a topic that carries the records ``names`` (Avro full
        names): the record's schema, or a union of them in this order for several; named types
        defined once, docs and defaults kept (a registry's compatibility check needs them)."""
        schemas = [
            load_schema(str(self.directory / f"{name}.avsc"), _write_hint=False)
            for name in names
        ]
        tree = schemas[0] if len(schemas) == 1 else schemas
        text = json.dumps(_define_once(tree, set()), separators=(",", ":"))
        # the same JSON: Apicurio 3.3's ccompat API cannot tell the type of a schema whose
        # text holds the string "{}" (a default), but reads it escaped
        return _EMPTY_OBJECT_STRING.sub(r'"\\u007b\\u007d"', text)

    def _learn_schema_id(self, schema_id: int) -> tuple[bytes, ...]:
        known = self._by_schema_id.get(schema_id)
        if known is not None:
            return known
        if self._schema_lookup is None:
            raise DecodeError(
                f"a record in Confluent's wire format (schema id {schema_id}), and no schema "
                "registry to look it up: set kafka.schema_registry.url "
                "[TRAJSTREAM_KAFKA__SCHEMA_REGISTRY__URL]"
            )
        try:
            text = self._schema_lookup(schema_id)
            raw = json.loads(text)
            if isinstance(raw, list):  # a topic's union: every branch self-contained
                expanded = parse_schema(raw, expand=True, _write_hint=False)
                branches = tuple(
                    self.register_writer(_define_once(branch, set())) for branch in expanded
                )
            else:
                branches = (self.register_writer(raw),)
        except DecodeError:
            raise
        except Exception as exc:  # the registry unreachable, or a schema fastavro refuses
            raise DecodeError(f"schema id {schema_id}: {exc}") from exc
        self._by_schema_id[schema_id] = branches
        return branches

    def _confluent_writer(self, data: bytes) -> tuple[_Writer, int]:
        schema_id = wire.read_confluent(data)
        branches = self._learn_schema_id(schema_id)
        offset = wire.CONFLUENT_HEADER
        index = 0
        if len(branches) > 1:
            index, offset = wire.read_varint(data, offset)
            if not 0 <= index < len(branches):
                raise DecodeError(
                    f"corrupt record: union branch {index} of schema id {schema_id}, which has "
                    f"{len(branches)}"
                )
        writer = self._by_fingerprint.get(branches[index])
        if writer is None:  # pragma: no cover - register_writer put it there
            raise DecodeError(f"schema id {schema_id}: unknown writer")
        return writer, offset

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, record: AvroModel) -> bytes:
        writer = self._by_model[type(record)]
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(writer.fingerprint)
        fastavro.schemaless_writer(buf, writer.schema, record.to_avro())
        return buf.getvalue()

    def encode_with(self, schema: Any, record: dict[str, Any]) -> bytes:
        """Encode a plain dict with any parsed schema (for tests of other schema versions)."""
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(schema_fingerprint(schema))
        fastavro.schemaless_writer(buf, schema, record)
        return buf.getvalue()

    # -- decoding ---------------------------------------------------------------------------

    def decode_raw(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """Decode to the record's full name and a plain dict (reader schema of this code)."""
        if data is None or (isinstance(data, bytes | bytearray | memoryview) and not data):
            raise DecodeError("an empty record (no value: a tombstone?): nothing to decode")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise DecodeError(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if wire.is_confluent(data):
            writer, header = self._confluent_writer(data)
        elif len(data) < _HEADER or data[:2] != MAGIC:
            raise DecodeError(
                "not an Avro single-object record (missing the C3 01 header) nor one in "
                "Confluent's wire format; publish with the trajstream SDK or `trajstream produce`"
            )
        else:
            header = _HEADER
            found = self._by_fingerprint.get(data[2:_HEADER])
            if found is None:
                raise DecodeError(
                    f"unknown writer schema fingerprint {data[2:_HEADER].hex()}; "
                    "register the producer's schema (newer schema version?)"
                )
            writer = found
        reader = self._readers.get(writer.name, writer.schema)
        if reader is writer.schema:
            # this code's own schema wrote it: nothing to resolve (and fastavro reads about a
            # third faster without a reader schema)
            reader = None
        body = io.BytesIO(data[header:])
        try:
            record = fastavro.schemaless_reader(
                body, writer.schema, reader, return_record_name=False
            )
        except Exception as exc:  # fastavro raises many types for corrupt bodies
            raise DecodeError(f"corrupt {writer.name} body: {exc}") from exc
        extra = len(data) - header - body.tell()
        if extra:
            raise DecodeError(f"corrupt {writer.name} body: {extra} bytes after the record")
        if not isinstance(record, dict):
            raise DecodeError(f"{writer.name} did not decode to a record")
        return writer.name, record

    def decode(self, data: bytes) -> AvroModel:
        """Decode bytes to the model of whichever record type wrote them."""
        name, record = self.decode_raw(data)
        model = self._model_of.get(name)
        if model is None:
            raise DecodeError(f"{name} records are not read by this version of trajstream")
        try:
            return model.model_validate(record)
        except pydantic.ValidationError as exc:
            raise ValidationError(f"invalid {name}: {_summarise(exc)}") from exc

    def decode_as(self, data: bytes, model: type[M]) -> M:
        """Decode bytes that must hold a ``model`` record."""
        value = self.decode(data)
        if not isinstance(value, model):
            raise DecodeError(f"expected {model.avro_name}, got {type(value).avro_name}")
        return value


_EMPTY_OBJECT_STRING = re.compile(r'(?<!\\)"\{\}"')
_REFERENCE = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)"')


def named_types(directory: Path, *, exclude: str | None = None) -> dict[str, Any]:
    """Every named type of the ``.avsc`` files in ``directory`` (but ``exclude``), parsed.

    Files are loaded dependencies first: fastavro leaves a half-parsed entry behind for a file
    whose named types it had to fetch from other files on the way.
    """
    paths = {p.stem: p for p in directory.glob("*.avsc")}
    order: list[str] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in order or name in trail or name not in paths:
            return
        for ref in _REFERENCE.findall(paths[name].read_text()):
            if ref != name:
                visit(ref, (*trail, name))
        order.append(name)

    for name in sorted(paths):
        visit(name, ())
    named: dict[str, Any] = {}
    for name in order:
        if name != exclude:
            load_schema(str(paths[name]), named_schemas=named, _write_hint=False)
    named.pop(exclude or "", None)
    # each entry self-contained: a nested named type inlined, as expand=True inlines the top
    for name in order:
        if name in named:
            named[name] = _inline(named[name], named, name)
    return named


def released_schemas(directory: Path | None = None) -> dict[str, dict[str, str]]:
    """The writer schema of every record type of ``directory`` (default: this code's), as a
    release keeps them: full name -> its fingerprint (hex) and its parsing canonical form."""
    codec = SchemaRegistry(directory)
    return {
        model.avro_name: {
            "fingerprint": codec.fingerprint_of(model).hex(),
            "schema": to_parsing_canonical_form(codec.schema_of(model)),
        }
        for model in sorted(codec._by_model, key=lambda m: m.avro_name)
    }


def write_released(version: str, directory: Path | None = None) -> Path:
    """Keep this code's writer schemas as release ``version``'s, in
    ``schemas/released/<version>.json`` (a step of making a release, CONTRIBUTING.md): later
    versions then read what this one writes. ``directory`` holds the ``.avsc`` files to keep
    (default: this code's); the file is written beside this code's schemas."""
    path = schema_dir() / RELEASED / f"{version}.json"
    path.parent.mkdir(exist_ok=True)
    records = released_schemas(directory)
    path.write_text(json.dumps({"version": version, "records": records}, indent=1) + "\n")
    return path


def _define_once(node: Any, seen: set[str]) -> Any:
    """A named type defined at its first use and named after, as in Avro's canonical form
    (``expand=True`` inlines every use, which changes the fingerprint)."""
    if isinstance(node, list):
        return [_define_once(n, seen) for n in node]
    if not isinstance(node, dict):
        return node
    name = node.get("name") if node.get("type") in ("record", "enum", "fixed") else None
    if isinstance(name, str):
        if name in seen:
            return name
        seen.add(name)
    return {
        k: _define_once(v, seen) if k in ("type", "items", "values", "fields") else v
        for k, v in node.items()
    }


def _inline(node: Any, named: dict[str, Any], own: str) -> Any:
    if isinstance(node, str):
        return named[node] if node != own and node in named else node
    if isinstance(node, list):
        return [_inline(n, named, own) for n in node]
    if isinstance(node, dict):
        return {k: _inline(v, named, own) if k in ("type", "items", "values", "fields") else v
                for k, v in node.items()}
    return node


def _full_name(schema: dict[str, Any]) -> str:
    name = str(schema["name"])
    return name if "." in name else f"{schema.get('namespace', '')}.{name}"


def _summarise(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "record"
        parts.append(f"{loc}: {err['msg']}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


@lru_cache(maxsize=1)
def _default_registry() -> SchemaRegistry:
    return SchemaRegistry()
