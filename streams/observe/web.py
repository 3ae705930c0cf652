"""The worker's small HTTP server: ``/metrics``, ``/healthz`` and ``/readyz``.

``GET /metrics``  the worker's registry in the Prometheus text format
``GET /healthz``  200 while the process answers (alive); 503 when the recovery of its tables
                  has read nothing for ``observe.recovery_stall_s``, or when a watched input
                  partition has had records waiting without progress for
                  ``observe.consumption_stall_s`` (:mod:`.progress`) (stalled: a liveness
                  probe restarts it)
``GET /readyz``   200 once partitions are assigned and the tables recovered, else 503

The port is bound synchronously by :meth:`ObserveServer.bind` before the worker connects to
Kafka, so a busy port stops the worker at start with the setting's name; the aiohttp runner is
started and stopped on the worker's own event loop (:meth:`start`, :meth:`stop`).

May import aiohttp, :mod:`streams.observe.metrics`, settings and errors; never faust.
"""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Callable

from aiohttp import web

from ..errors import ConfigError
from .metrics import CONTENT_TYPE, Metrics

__all__ = ["ObserveServer", "bind_socket"]


SETTING = "bad setting observe.port [TRAJSTREAM_OBSERVE__PORT]"


def bind_socket(host: str, port: int, setting: str = SETTING) -> socket.socket:
    """A listening TCP socket on host:port, or a ConfigError that starts with ``setting``."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"bad setting observe.host: cannot resolve {host!r}: {exc}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        hint = (
            "another process uses it: give each worker on a host its own port, or 0 to turn "
            "the server off"
            if exc.errno == errno.EADDRINUSE
            else str(exc)
        )
        raise ConfigError(f"{setting}: cannot listen on {host}:{port}: {hint}") from exc
    sock.setblocking(False)
    return sock


class ObserveServer:
    """Serves one :class:`Metrics` object. ``routes`` adds more (the status page)."""

    def __init__(
        self,
        metrics: Metrics,
        host: str,
        port: int,
        *,
        routes: Callable[[web.Application], None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._routes = routes
        self._sock: socket.socket | None = None
        self._runner: web.AppRunner | None = None

    def bind(self) -> ObserveServer:
        """Own the port now (raises ConfigError when it is busy); serve it after :meth:`start`."""
        if self._sock is None:
            self._sock = bind_socket(self.host, self.port)
            self.port = self._sock.getsockname()[1]
        return self

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        host = "[::1]" if host == "::" else host
        return f"http://{host}:{self.port}"

    def application(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        if self._routes is not None:
            self._routes(app)
        return app

    async def start(self) -> str:
        self.bind()
        assert self._sock is not None
        self._runner = web.AppRunner(self.application(), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _metrics(self, request: web.Request) -> web.Response:
        """The worker's metrics in the Prometheus text format."""
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        """Liveness: 200 ``{"status": "alive"}``; 503 ``{"status": "stalled", "reason"}`` while
        a table recovery or a watched input partition is stalled."""
        reason = self.metrics.stall_reason()
        if reason is not None:
            return web.json_response({"status": "stalled", "reason": reason}, status=503)
        return web.json_response({"status": "alive"})

    async def _readyz(self, request: web.Request) -> web.Response:
        """Readiness: 200 once partitions are assigned and the tables recovered, else 503;
        ``{"ready", "assigned_partitions", "tables_recovered"}``."""
        m = self.metrics
        body = {
            "ready": m.ready,
            "assigned_partitions": len(m.assigned),
            "tables_recovered": m.recovered,
        }
        return web.Response(
            status=200 if m.ready else 503,
            text=json.dumps(body),
            content_type="application/json",
        )
