"""The stand-in server: :class:`StandIn` (its lifecycle, the listening socket and the ``down``
fault), the blocking :func:`run` of ``trajstream standin``, and small HTTP helpers for tests.

May import: anything; a dev tool, never imported by the product.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final, cast

import httpx
from aiohttp import web

from .journal import Journal
from .routes import Routes
from .state import ChatFault, Fault, StandInState

__all__ = [
    "StandIn",
    "fetch_state",
    "reset_state",
    "run",
    "set_chat_fault",
    "set_fault",
]


logger = logging.getLogger(__name__)


_DEFAULT_PORT: Final = 8010  # Trinity's serve-mode default

_FREEZE_EVERY_S: Final = 5.0


class StandIn(Routes):
    """The stand-in server. ``await start()`` returns its URL; ``await stop()`` ends it.

    Example::

        standin = StandIn()
        url = await standin.start()          # http://127.0.0.1:<free port>
        ...                                   # point a TrinityClient at url
        assert standin.state.explore_step == 1
        await standin.stop()
    """

    def __init__(
        self,
        *,
        model: str = "standin-model",
        shutdown_timeout: float = 1.0,
        journal: Path | None = None,
        sync_interval: int = 0,
    ) -> None:
        self.model = model
        self._shutdown_timeout = shutdown_timeout
        self._state = StandInState()
        self._journal = Journal(journal) if journal is not None else None
        self.sync_interval = sync_interval
        """Every this many commits advance the model version by one (0: it stays as set)."""
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._host = "127.0.0.1"
        self._port = 0
        self._reopen_task: asyncio.Task[None] | None = None
        self._created = int(time.time())
        self._frozen = False

    @property
    def state(self) -> StandInState:
        """The live state (not a copy)."""
        return self._state

    @property
    def url(self) -> str:
        """The base URL; valid after :meth:`start`."""
        if self._runner is None:
            raise RuntimeError("the stand-in is not started")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def is_down(self) -> bool:
        """True while the listening socket is closed by a ``down`` fault."""
        return self._runner is not None and self._site is None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0 picks a free port) and return the base URL."""
        if self._runner is not None:
            raise RuntimeError("the stand-in is already started")
        if self._journal is not None:  # where a killed stand-in on this file was
            read = self._journal.load(self._state)
            self._journal.open()
            if read:
                logger.info("stand-in journal %s: %d events read", self._journal.path, read)
        app = web.Application(middlewares=[self._middleware])
        self._add_routes(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self._shutdown_timeout)
        await runner.setup()
        self._runner = runner
        self._host, self._port = host, port
        try:
            await self._open()
        except BaseException:
            self._runner = None
            await runner.cleanup()
            raise
        return self.url

    async def stop(self) -> None:
        """Stop listening, close every connection and cancel a pending reopen."""
        task = self._cancel_reopen()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._released.set()  # hung chat requests end (their connections are dropped)
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await runner.cleanup()
        if self._journal is not None:
            self._journal.close()

    async def set_fault(self, fault: Fault) -> None:
        """Inject ``fault`` (replacing the current one); ``Fault()`` clears it.

        ``down`` closes the listening socket and the open connections now and reopens after
        ``fault.seconds``; any other mode reopens at once if the server is down.
        """
        self._cancel_reopen()
        if fault.mode == "down":
            fault.until = time.monotonic() + fault.seconds
            self._state.fault = fault
            await self._close_listener()
            self._reopen_task = asyncio.create_task(self._reopen_after(fault.seconds))
        else:
            self._state.fault = fault
            if self.is_down:
                await self._open()
        logger.info("stand-in fault set to %s", fault.to_json())

    def set_chat_fault(self, fault: ChatFault) -> None:
        """How the chat route answers from now on (:class:`ChatFault`); ``ChatFault()`` clears
        it. Requests a ``hang`` holds end now (their connections are dropped)."""
        self._state.chat_fault = fault
        self._released.set()
        self._released = asyncio.Event()
        logger.info("stand-in chat fault set to %s", fault.to_json())

    async def reset(self) -> None:
        """Forget every experience, request and commit (the journal too), and clear the
        faults."""
        self._state = StandInState()
        if self._journal is not None:
            self._journal.truncate()
        if self._frozen:  # what the old state froze may be collected again
            gc.unfreeze()
        self.set_chat_fault(ChatFault())
        await self.set_fault(Fault())

    def run(self, host: str = "127.0.0.1", port: int = _DEFAULT_PORT) -> None:
        """Serve until SIGINT or SIGTERM (blocking); logs one line with the URL."""
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(message)s")
        asyncio.run(self._serve_forever(host, port))

    async def _serve_forever(self, host: str, port: int) -> None:
        url = await self.start(host, port)
        logger.info("Trinity stand-in listening on %s (Ctrl-C to stop)", url)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, stopping.set)
        freezer = asyncio.create_task(self._keep_state_out_of_collections(_FREEZE_EVERY_S))
        try:
            await stopping.wait()
        finally:
            freezer.cancel()
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.stop()

    async def _keep_state_out_of_collections(self, every: float) -> None:
        """The process's own stand-in (``trajstream standin``): what it keeps of each request
        (an experience: every request it ever served, until a reset) moved out of the cyclic
        garbage collector's generations every ``every`` seconds (:func:`gc.freeze`, after a
        collection of the young generations). Without it, its full collections scan all it
        ever kept: 300-400 ms after a few minutes at 1,000 requests/s (measured in
        ``bench/gateway.py``, where it is the upstream of every path), pauses that are the
        stand-in's, not the gateway's. A reset unfreezes, so the state it drops is collected."""
        while True:
            await asyncio.sleep(every)
            gc.collect(1)
            gc.freeze()
            self._frozen = True

    async def _open(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self._site = site
        if self._port == 0:
            self._port = int(self._runner.addresses[0][1])

    async def _close_listener(self) -> None:
        site, self._site = self._site, None
        if site is not None:
            await site.stop()
        # Keep-alive connections would outlive the listening socket: drop them all, as a dead
        # server would, so pooled clients reconnect and are refused. (The answer to the
        # fault request itself is already flushed; transport.close() sends buffered data.)
        if self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                handler.force_close()

    async def _reopen_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._state.fault = Fault()
        while self._runner is not None and self._site is None:
            try:
                await self._open()
            except OSError as exc:  # the port may be briefly taken; keep trying
                logger.warning("stand-in cannot listen again yet: %s", exc)
                await asyncio.sleep(0.1)
        self._reopen_task = None
        logger.info("stand-in listening again on %s", self.url)

    def _cancel_reopen(self) -> asyncio.Task[None] | None:
        task, self._reopen_task = self._reopen_task, None
        if task is None or task is asyncio.current_task():
            return None
        task.cancel()
        return task

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.is_down:
            # A request on a keep-alive connection that raced the close: drop it unanswered.
            request.protocol.force_close()
            return web.Response(status=503)
        return await handler(request)


async def fetch_state(base_url: str, *, http_timeout: float = 5.0) -> dict[str, Any]:
    """Return ``GET /_standin/state`` of the stand-in at ``base_url``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=http_timeout) as http:
        response = await http.get("/_standin/state")
        response.raise_for_status()
        return cast(dict[str, Any], response.json())


async def set_fault(base_url: str, fault: dict[str, Any], *, http_timeout: float = 5.0) -> None:
    """``POST /_standin/fault``; e.g. ``{"mode": "error", "status": 503, "count": 2}``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=http_timeout) as http:
        response = await http.post("/_standin/fault", json=fault)
        response.raise_for_status()


async def reset_state(base_url: str, *, http_timeout: float = 5.0) -> None:
    """``POST /_standin/reset``: forget everything and clear the fault."""
    async with httpx.AsyncClient(base_url=base_url, timeout=http_timeout) as http:
        response = await http.post("/_standin/reset")
        response.raise_for_status()


async def set_chat_fault(
    base_url: str, fault: dict[str, Any], *, http_timeout: float = 5.0
) -> None:
    """``POST /_standin/chat-fault``; e.g. ``{"mode": "error", "status": 503,
    "retry_after": 2}``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=http_timeout) as http:
        response = await http.post("/_standin/chat-fault", json=fault)
        response.raise_for_status()


def run(
    host: str = "127.0.0.1",
    port: int = _DEFAULT_PORT,
    *,
    model: str = "standin-model",
    journal: Path | None = None,
    sync_interval: int = 0,
) -> None:
    """Blocking entry point for ``trajstream standin``: serve until SIGINT or SIGTERM."""
    StandIn(model=model, journal=journal, sync_interval=sync_interval).run(host, port)
