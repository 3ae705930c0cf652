"""OTLP/HTTP trace ingest: the ``POST /v1/traces`` endpoint, mountable on any aiohttp app.

:func:`add_otlp_routes` adds the endpoint to an application (the gateway's, or the standalone
server of ``trajstream otlp``, :func:`run_otlp`). A request is answered as the OTLP/HTTP
specification says: protobuf (``application/x-protobuf``) or OTLP JSON (``application/json``)
bodies, optionally gzip-compressed (decompressed by aiohttp as it reads, or here when the server
was started without ``auto_decompress``); 200 with an ``ExportTraceServiceResponse`` in the
request's encoding, whose ``partial_success`` names the spans that were rejected; 400 for a
body that cannot be decoded; 413 for a body above the limit; 415 for another content type or
encoding; 503 (with ``Retry-After``) when the records could not be published, so that the
exporter retries. The answer is sent only once the broker has the records: what was answered
200 is not lost, and what an exporter sends again is deduplicated by the workers.

May import: aiohttp, the pure mapping (:mod:`.otlp`), the models, settings and errors.
Publishing is a callable given by the caller; only :func:`run_otlp` builds a Kafka producer.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestPayloadError

from ..models import AgentCall, Completion
from ..settings import Settings
from .otlp import (
    MissingParent,
    OtlpDecodeError,
    decode_json,
    decode_protobuf,
    encode_response,
    map_request,
)

__all__ = ["OtlpIngest", "Publish", "add_otlp_routes", "run_otlp"]

log = logging.getLogger("trajstream.otlp")

Publish = Callable[[Sequence[AgentCall | Completion]], Awaitable[None]]
"""Publishes records and returns once the broker has all of them (raises otherwise)."""

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# aiohttp decompresses these as it reads (gzip, deflate; br and zstd when their libraries are
# installed) and answers 400 itself for a br or zstd body it cannot decode
_ENCODINGS = frozenset({"", "identity", "gzip", "deflate", "br", "zstd"})
_GZIP_MAGIC = b"\x1f\x8b"

# google.rpc.Status codes used in error bodies
_INVALID_ARGUMENT, _UNAVAILABLE, _RESOURCE_EXHAUSTED = 3, 14, 8


@dataclass
class OtlpIngest:
    """The endpoint's handler and its counters (``stats``)."""

    publish: Publish
    max_body: int = 16 * 1024 * 1024
    publish_timeout: float = 5.0
    missing_parent: MissingParent = "agent"
    stats: Counter[str] = field(default_factory=Counter)

    async def handle(self, request: web.Request) -> web.Response:
        self.stats["requests"] += 1
        media = request.content_type  # without parameters such as charset
        if media not in (PROTOBUF, JSON):
            return self._error(
                415, f"unsupported content type {media!r}: send {PROTOBUF} or {JSON}", PROTOBUF
            )
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in _ENCODINGS:
            return self._error(
                415, f"unsupported content encoding {encoding!r}: send gzip or none", media
            )
        try:
            body = await _read(request, self.max_body)
        except (ContentEncodingError, RequestPayloadError) as exc:
            self.stats["requests.undecodable"] += 1
            return self._error(400, f"body cannot be decompressed ({encoding}): {exc}", media)
        if body is None:
            return self._error(
                413, f"request body exceeds {self.max_body} bytes", media, _RESOURCE_EXHAUSTED
            )
        if encoding == "gzip" and body[:2] == _GZIP_MAGIC:
            # still compressed: a server started with auto_decompress=False
            try:
                body = _gunzip(body, self.max_body)
            except _TooLarge:
                return self._error(
                    413,
                    f"decompressed body exceeds {self.max_body} bytes",
                    media,
                    _RESOURCE_EXHAUSTED,
                )
            except (OSError, EOFError, zlib.error) as exc:
                self.stats["requests.undecodable"] += 1
                return self._error(400, f"body cannot be decompressed (gzip): {exc}", media)
        try:
            export = decode_protobuf(body) if media == PROTOBUF else decode_json(body)
        except OtlpDecodeError as exc:
            self.stats["requests.undecodable"] += 1
            return self._error(400, str(exc), media)
        mapped = map_request(export, missing_parent=self.missing_parent)
        if mapped.records:
            try:
                await asyncio.wait_for(self.publish(mapped.records), self.publish_timeout)
            except Exception as exc:  # any failure to publish: the exporter retries
                self.stats["requests.unavailable"] += 1
                log.warning("could not publish %d records: %r", len(mapped.records), exc)
                return self._error(
                    503, f"could not publish to Kafka: {exc!r}"[:300], media, _UNAVAILABLE
                )
        self.stats["spans"] += mapped.spans
        self.stats["spans.ignored"] += mapped.ignored
        self.stats["spans.rejected"] += len(mapped.rejected)
        self.stats["records"] += len(mapped.records)
        if mapped.rejected:
            log.info("rejected %d spans: %s", len(mapped.rejected), mapped.error_message())
        payload = encode_response(
            len(mapped.rejected), mapped.error_message(), as_json=media == JSON
        )
        return web.Response(body=payload, status=200, content_type=media)

    def _error(
        self, status: int, message: str, media: str, code: int = _INVALID_ARGUMENT
    ) -> web.Response:
        """An error answer: a ``google.rpc.Status`` in the request's encoding."""
        headers = {"Retry-After": "1"} if status == 503 else None
        if media == JSON:
            return web.json_response(
                {"code": code, "message": message}, status=status, headers=headers
            )
        return web.Response(
            body=_rpc_status(code, message), status=status, content_type=PROTOBUF, headers=headers
        )


def add_otlp_routes(
    app: web.Application,
    publish: Publish,
    *,
    max_body: int = 16 * 1024 * 1024,
    publish_timeout: float = 5.0,
    missing_parent: MissingParent = "agent",
    path: str = "/v1/traces",
) -> OtlpIngest:
    """Mount ``POST /v1/traces`` on ``app``; records go to ``publish``.

    Example (the gateway)::

        ingest = add_otlp_routes(app, producer.publish_many)
    """
    ingest = OtlpIngest(publish, max_body, publish_timeout, missing_parent)
    app.router.add_post(path, ingest.handle)
    return ingest


async def _read(request: web.Request, limit: int) -> bytes | None:
    """The body, or None when it exceeds ``limit`` (read by chunks, whatever the app's own
    ``client_max_size``)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class _TooLarge(Exception):
    pass


def _gunzip(body: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise _TooLarge
    if not inflater.eof:
        raise EOFError("gzip stream ends early")
    return out


def _rpc_status(code: int, message: str) -> bytes:
    """A protobuf ``google.rpc.Status`` {code, message} (two fields, encoded by hand: the
    message type lives in googleapis-common-protos, which the ingest need not depend on)."""
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# -- the standalone server (``trajstream otlp``) ----------------------------------------------


async def run_otlp(
    settings: Settings,
    bootstrap: str,
    *,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``POST /v1/traces`` on ``otlp.host``:``otlp.port``, publishing with the SDK's
    producer, until ``stop`` is set (without one: until SIGTERM or SIGINT)."""
    from .sdk import TrajstreamProducer

    cfg = settings.otlp
    async with TrajstreamProducer(
        bootstrap,
        topic_prefix=settings.kafka.topic_prefix,
        partitions=settings.kafka.partitions,
        security=settings.kafka.security,
        schema_registry=settings.kafka.schema_registry,
    ) as producer:
        app = web.Application()
        add_otlp_routes(
            app,
            producer.publish_many,
            max_body=cfg.max_body_bytes,
            publish_timeout=cfg.publish_timeout_s,
            missing_parent=cfg.missing_parent,
        )
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, cfg.host, cfg.port)
        await site.start()
        try:
            addresses = runner.addresses  # the bound (host, port), also for port 0
            port = addresses[0][1] if addresses else cfg.port
            url = f"http://{cfg.host}:{port}/v1/traces"
            log.info("OTLP/HTTP trace ingest on %s", url)
            if ready is not None:
                ready(url)
            if stop is None:  # the command: stop on SIGTERM or SIGINT, after the requests in flight
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()
