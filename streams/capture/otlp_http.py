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

May import: aiohttp, the pure mapping (:mod:`.otlp`), the models, settings and errors,
:mod:`streams.process`.
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
from typing import Literal

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestPayloadError

from ..models import AgentCall, Completion, TraceFragment, utcnow
from ..process import keep_out_of_collections
from ..settings import Settings
from .otlp import (
    MissingParent,
    OtlpDecodeError,
    decode_json,
    decode_protobuf,
    encode_response,
    map_request,
)
from .otlp_trace import fragment_request

__all__ = ["OtlpIngest", "Publish", "add_otlp_routes", "run_otlp"]

log = logging.getLogger("trajstream.otlp")

Publish = Callable[[Sequence[AgentCall | Completion | TraceFragment]], Awaitable[None]]
"""Publishes records and returns once the broker has all of them (raises otherwise): agent
events keyed by call_id, or (``resolve="trace"``) trace fragments keyed by trace id."""

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# aiohttp decompresses these as it reads (gzip, deflate; br and zstd when their libraries are
# installed) and answers 400 itself for a br or zstd body it cannot decode
_ENCODINGS = frozenset({"", "identity", "gzip", "deflate", "br", "zstd"})
_GZIP_MAGIC = b"\x1f\x8b"

Resolve = Literal["export", "trace"]

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
    resolve: Resolve = "export"
    """``export``: map each export on its own (agent events); ``trace``: publish every span
    as trace fragments, for the span-resolution stage (:mod:`.otlp_trace`)."""

    async def handle(self, request: web.Request) -> web.Response:
        """An OTLP/HTTP trace export (protobuf or JSON, gzip or not): its GenAI spans
        published as agent events (or trace fragments); 200 with ``partial_success`` naming
        rejected spans, 400 undecodable, 413 too large, 415 other media, 503 Kafka too slow."""
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
            # the rest of the body cannot be read either: end it here and close the connection
            # after the answer, or aiohttp reads on, hits the same error and logs a traceback
            request.content.feed_eof()
            answer = self._refuse(
                request, f"body cannot be decompressed ({encoding}): {_cause(exc)}", media
            )
            answer.force_close()
            return answer
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
                return self._refuse(request, f"body cannot be decompressed (gzip): {exc}", media)
        try:
            export = decode_protobuf(body) if media == PROTOBUF else decode_json(body)
        except OtlpDecodeError as exc:
            self.stats["requests.undecodable"] += 1
            return self._refuse(request, str(exc), media)
        if self.resolve == "trace":
            mapped = fragment_request(export, utcnow())
            records: Sequence[AgentCall | Completion | TraceFragment] = mapped.fragments
        else:
            mapped = map_request(export, missing_parent=self.missing_parent)
            records = mapped.records
        if records:
            try:
                await asyncio.wait_for(self.publish(records), self.publish_timeout)
            except Exception as exc:  # any failure to publish: the exporter retries
                self.stats["requests.unavailable"] += 1
                log.warning("could not publish %d records: %r", len(records), exc)
                return self._error(
                    503, f"could not publish to Kafka: {exc!r}"[:300], media, _UNAVAILABLE
                )
        self.stats["spans"] += mapped.spans
        self.stats["spans.ignored"] += mapped.ignored
        self.stats["spans.rejected"] += len(mapped.rejected)
        self.stats["records"] += len(records)
        if mapped.rejected:
            log.info("rejected %d spans: %s", len(mapped.rejected), mapped.error_message())
        payload = encode_response(
            len(mapped.rejected), mapped.error_message(), as_json=media == JSON
        )
        return web.Response(body=payload, status=200, content_type=media)

    def _refuse(self, request: web.Request, message: str, media: str) -> web.Response:
        """400 for a body that cannot be decoded, with one warning line (no traceback)."""
        log.warning("refused an export from %s: %s", request.remote or "?", message)
        return self._error(400, message, media)

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
    resolve: Resolve = "export",
) -> OtlpIngest:
    """Mount ``POST /v1/traces`` on ``app``; records go to ``publish``.

    Example (the gateway)::

        ingest = add_otlp_routes(app, producer.publish_many)
    """
    ingest = OtlpIngest(publish, max_body, publish_timeout, missing_parent, resolve=resolve)
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


def _cause(exc: BaseException) -> str:
    """One line saying why a body could not be read (aiohttp's message spans lines; the
    decompressor's own error, its cause, says more)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, zlib.error) and cause.__cause__:
        cause = cause.__cause__
    text = getattr(cause, "message", None) or str(cause)
    return " ".join(str(text).split())[:200] or type(exc).__name__


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
    async with TrajstreamProducer.from_settings(settings, bootstrap) as producer:
        app = web.Application()
        add_otlp_routes(
            app,
            producer.publish_many,
            max_body=cfg.max_body_bytes,
            publish_timeout=cfg.publish_timeout_s,
            missing_parent=cfg.missing_parent,
            resolve=cfg.resolve,
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
                keep_out_of_collections()  # the process's own: what the start built stays
            await stop.wait()
        finally:
            await runner.cleanup()
