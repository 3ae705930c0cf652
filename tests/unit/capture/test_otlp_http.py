"""Unit tests of streams.capture.otlp_http: the endpoint's answers, over real loopback HTTP,
with a recording publish function in place of Kafka (the seam the gateway also uses)."""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from streams.capture.otlp_http import OtlpIngest, add_otlp_routes
from streams.models import AgentCall, Completion

from .otlp_spans import AGENT, CHAT1, agent_call_spans, export, span
from .test_otlp import otlp_json


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[AgentCall | Completion]] = []
        self.fail: BaseException | None = None
        self.delay = 0.0

    async def __call__(self, records: Sequence[AgentCall | Completion]) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        self.batches.append(list(records))


@pytest.fixture
async def server() -> AsyncIterator[tuple[httpx.AsyncClient, Recorder, OtlpIngest]]:
    recorder = Recorder()
    app = web.Application()
    ingest = add_otlp_routes(app, recorder, max_body=64 * 1024, publish_timeout=0.5)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    try:
        async with httpx.AsyncClient(base_url=str(test_server.make_url(""))) as client:
            yield client, recorder, ingest
    finally:
        await test_server.close()


PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def body_pb() -> bytes:
    return export(*agent_call_spans().values()).SerializeToString()


async def test_protobuf_export_is_published_and_answered_in_protobuf(server: Any) -> None:
    client, recorder, ingest = server
    response = await client.post("/v1/traces", content=body_pb(), headers=PB)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-protobuf"
    parsed = ExportTraceServiceResponse.FromString(response.content)
    assert not parsed.HasField("partial_success")
    (batch,) = recorder.batches
    assert len(batch) == 5
    assert ingest.stats["spans"] == 4 and ingest.stats["records"] == 5


async def test_json_gzip_export_is_answered_in_json(server: Any) -> None:
    client, recorder, _ = server
    body = gzip.compress(otlp_json(export(*agent_call_spans().values())))
    response = await client.post(
        "/v1/traces",
        content=body,
        headers={"Content-Type": "application/json; charset=utf-8", "Content-Encoding": "gzip"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {}
    assert len(recorder.batches[0]) == 5


async def test_rejected_spans_are_named_in_partial_success(server: Any) -> None:
    client, recorder, _ = server
    bad = span(
        "8888888888888888",
        parent=AGENT,
        name="bad tokens",
        attrs={"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": -1},
    )
    request = export(agent_call_spans()[CHAT1], bad)
    response = await client.post("/v1/traces", content=otlp_json(request), headers=JS)
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert (
        "8888888888888888" in partial["errorMessage"] and "input_tokens" in partial["errorMessage"]
    )
    response = await client.post("/v1/traces", content=request.SerializeToString(), headers=PB)
    parsed = ExportTraceServiceResponse.FromString(response.content)
    assert parsed.partial_success.rejected_spans == 1
    assert [len(b) for b in recorder.batches] == [1, 1]


async def test_spans_without_genai_attributes_publish_nothing(server: Any) -> None:
    client, recorder, ingest = server
    plain = export(span(CHAT1, attrs={"http.route": "/"}), span(AGENT))
    response = await client.post("/v1/traces", content=plain.SerializeToString(), headers=PB)
    assert response.status_code == 200
    assert recorder.batches == [] and ingest.stats["spans.ignored"] == 2


@pytest.mark.parametrize(
    ("content", "headers", "status", "says"),
    [
        (b"\x0a\xff\xff\xff\xff\x0f", PB, 400, "not a protobuf"),
        (b"{nope", JS, 400, "not JSON"),
        (b"\x1f\x8bnot gzip", {**PB, "Content-Encoding": "gzip"}, 400, "cannot be decompressed"),
        (b"x", {"Content-Type": "text/plain"}, 415, "unsupported content type"),
        (b"x", {**PB, "Content-Encoding": "snappy"}, 415, "unsupported content encoding"),
        (b"x" * (65 * 1024), PB, 413, "exceeds"),
        (gzip.compress(b"\x00" * (200 * 1024)), {**PB, "Content-Encoding": "gzip"}, 413, "exceeds"),
    ],
    ids=["bad-protobuf", "bad-json", "bad-gzip", "text", "snappy", "too-large", "gzip-bomb"],
)
async def test_bad_requests_are_answered_with_the_reason(
    server: Any, content: bytes, headers: dict[str, str], status: int, says: str
) -> None:
    client, recorder, _ = server
    response = await client.post("/v1/traces", content=content, headers=headers)
    assert response.status_code == status
    if headers["Content-Type"] == "application/json":
        assert says in response.json()["message"]
    else:
        assert says.encode() in response.content  # google.rpc.Status, message field
    assert recorder.batches == []


async def test_kafka_failure_is_503_so_the_exporter_retries(server: Any) -> None:
    client, recorder, ingest = server
    recorder.fail = ConnectionError("broker down")
    response = await client.post("/v1/traces", content=body_pb(), headers=PB)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert b"broker down" in response.content
    recorder.fail, recorder.delay = None, 2.0  # slower than publish_timeout
    response = await client.post(
        "/v1/traces", content=otlp_json(export(*agent_call_spans().values())), headers=JS
    )
    assert response.status_code == 503 and response.json()["code"] == 14
    recorder.delay = 0.0
    response = await client.post("/v1/traces", content=body_pb(), headers=PB)
    assert response.status_code == 200
    assert ingest.stats["requests.unavailable"] == 2


async def test_the_error_body_is_a_google_rpc_status(server: Any) -> None:
    client, _, _ = server
    response = await client.post("/v1/traces", content=b"x", headers={"Content-Type": "text/csv"})
    body = response.content
    assert body[0] == 0x08 and body[1] == 3  # code: INVALID_ARGUMENT
    assert body[2] == 0x12 and body[4:].decode().startswith("unsupported content type")


async def test_gzip_is_decompressed_here_when_the_server_does_not() -> None:
    recorder = Recorder()
    app = web.Application()
    add_otlp_routes(app, recorder)
    test_server = TestServer(app, host="127.0.0.1", auto_decompress=False)
    await test_server.start_server()
    try:
        async with httpx.AsyncClient(base_url=str(test_server.make_url(""))) as client:
            headers = {**PB, "Content-Encoding": "gzip"}
            ok = await client.post("/v1/traces", content=gzip.compress(body_pb()), headers=headers)
            broken = await client.post("/v1/traces", content=b"\x1f\x8b\x08junk", headers=headers)
    finally:
        await test_server.close()
    assert ok.status_code == 200 and len(recorder.batches[0]) == 5
    assert broken.status_code == 400 and b"cannot be decompressed" in broken.content


def test_otlp_settings_fail_at_start_with_their_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.errors import ConfigError
    from streams.settings import load_settings

    monkeypatch.setenv("TRAJSTREAM_OTLP__PORT", "70000")
    with pytest.raises(ConfigError, match=r"otlp\.port \[TRAJSTREAM_OTLP__PORT\]"):
        load_settings()
    monkeypatch.setenv("TRAJSTREAM_OTLP__PORT", "4319")
    monkeypatch.setenv("TRAJSTREAM_OTLP__MISSING_PARENT", "own")
    settings = load_settings()
    assert (settings.otlp.port, settings.otlp.missing_parent) == (4319, "own")
    monkeypatch.setenv("TRAJSTREAM_OTLP__MISSING_PARENT", "nobody")
    with pytest.raises(ConfigError, match=r"otlp\.missing_parent"):
        load_settings()


@pytest.mark.parametrize(
    ("encoding", "auto_decompress"),
    [("gzip", True), ("deflate", True), ("gzip", False)],
    ids=["gzip-by-aiohttp", "deflate-by-aiohttp", "gzip-here"],
)
async def test_an_undecompressible_body_is_one_warning_line_without_traceback(
    caplog: pytest.LogCaptureFixture, encoding: str, auto_decompress: bool
) -> None:
    recorder = Recorder()
    app = web.Application()
    add_otlp_routes(app, recorder)
    test_server = TestServer(app, host="127.0.0.1", auto_decompress=auto_decompress)
    await test_server.start_server()
    caplog.set_level("DEBUG")
    try:
        async with httpx.AsyncClient(base_url=str(test_server.make_url(""))) as client:
            headers = {**PB, "Content-Encoding": encoding}
            junk = b"\x1f\x8b\x08" + b"not compressed at all " * 50
            broken = await client.post("/v1/traces", content=junk, headers=headers)
            await asyncio.sleep(0.3)  # aiohttp would log its traceback after the answer
            ok = await client.post("/v1/traces", content=body_pb(), headers=PB)
    finally:
        await test_server.close()
    assert broken.status_code == 400 and b"cannot be decompressed" in broken.content
    assert ok.status_code == 200  # the server serves on
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelname) for r in loud] == [("trajstream.otlp", "WARNING")], [
        r.getMessage() for r in loud
    ]
    assert "\n" not in loud[0].getMessage() and f"({encoding})" in loud[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)
