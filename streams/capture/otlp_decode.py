"""OTLP export requests decoded: protobuf and OTLP JSON bodies, and each span as plain values.

:func:`decode_protobuf` and :func:`decode_json` turn an ``ExportTraceServiceRequest`` body into
the protobuf message (an :class:`OtlpDecodeError` names what is wrong with a bad one);
:func:`spans_of` yields its spans as :class:`SpanView`\\ s (ids in hex, attributes as Python
values, the resource's attributes beside them); :func:`encode_response` makes the answer, with
``partial_success`` when spans were rejected. The mapping to records is :mod:`.otlp`.

May import: the standard library, protobuf and ``opentelemetry-proto``, the package's errors.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from ..errors import DecodeError

__all__ = [
    "OtlpDecodeError",
    "SpanView",
    "decode_json",
    "decode_protobuf",
    "encode_response",
    "spans_of",
]


class OtlpDecodeError(DecodeError):
    """The body is not an OTLP ExportTraceServiceRequest (answered with 400)."""


# -- decoding ---------------------------------------------------------------------------------


def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """An ``application/x-protobuf`` body."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (ProtobufDecodeError, ValueError, RecursionError) as exc:
        raise OtlpDecodeError(f"not a protobuf ExportTraceServiceRequest: {exc}") from exc
    return request


def decode_json(body: bytes) -> ExportTraceServiceRequest:
    """An ``application/json`` body in the OTLP JSON encoding.

    OTLP JSON is protobuf's JSON mapping (lowerCamelCase keys, enums as integers, 64-bit
    integers as strings or numbers) except that trace and span ids are hex strings, not
    base64; unknown fields are ignored, as the specification asks of receivers.
    """
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OtlpDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise OtlpDecodeError("not an OTLP JSON object (an ExportTraceServiceRequest)")
    try:
        for resource_spans in _items(data, "resourceSpans", "resource_spans"):
            for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
                for span in _items(scope_spans, "spans"):
                    _hex_ids_to_base64(span)
                    for link in _items(span, "links"):
                        _hex_ids_to_base64(link)
        request = ExportTraceServiceRequest()
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise OtlpDecodeError(f"not an OTLP JSON ExportTraceServiceRequest: {exc}") from exc
    return request


def _items(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise OtlpDecodeError(f"expected an object holding {keys[0]!r}, got {type(obj).__name__}")
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise OtlpDecodeError(f"{key!r} must be an array")
        return value
    return []


def _hex_ids_to_base64(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise OtlpDecodeError("a span or link must be an object")
    for camel, snake in (
        ("traceId", "trace_id"),
        ("spanId", "span_id"),
        ("parentSpanId", "parent_span_id"),
    ):
        for key in (camel, snake):
            value = obj.get(key)
            if isinstance(value, str):
                try:
                    raw = bytes.fromhex(value)
                except ValueError:
                    raise OtlpDecodeError(f"{key} {value!r} is not a hex string") from None
                obj[key] = base64.b64encode(raw).decode()


def encode_response(rejected: int, message: str, *, as_json: bool) -> bytes:
    """An ExportTraceServiceResponse, with ``partial_success`` when spans were rejected."""
    response = ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if as_json:
        return str(json_format.MessageToJson(response, indent=None)).encode()
    return bytes(response.SerializeToString())


# -- a span, as plain values ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpanView:
    """One span with its ids in hex and its attributes as Python values."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    status: int = Status.STATUS_CODE_UNSET
    status_message: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[tuple[str, int, Mapping[str, Any]], ...] = ()
    resource: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return self.trace_id, self.span_id

    @property
    def ref(self) -> str:
        """How a rejection names the span."""
        return f"span {self.span_id or '?'} of trace {self.trace_id or '?'} ({self.name!r})"


def spans_of(request: ExportTraceServiceRequest) -> Iterator[SpanView]:
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield _view(span, resource)


def _view(span: PbSpan, resource: Mapping[str, Any]) -> SpanView:
    return SpanView(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        status=span.status.code,
        status_message=span.status.message,
        attributes=_attributes(span.attributes),
        events=tuple((e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events),
        resource=resource,
    )


def _attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)
