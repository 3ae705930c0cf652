"""What every route of the gateway shares: the settings and upstreams, the call table and
the decision of a call's route, the publisher and the wait for the broker (``acked``), the
background tasks. The routes build on it (:mod:`.chat_routes`, :mod:`.api_routes`).

May import: its siblings :mod:`.requests`, :mod:`.calls`, :mod:`.upstream`, and what they do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

from aiohttp import web

from ...core.select import Strategy
from ...models import AgentCall, Completion
from ...settings import Settings
from ..publisher import Publisher
from ..recorder import RecorderProcess
from ..routing import Route, check_routable, decide_route
from .calls import CallState, CallTable, GatewayStats
from .requests import call_id_of, json_body, openai_error, parse_json, start_event
from .upstream import Upstreams

T = TypeVar("T")


class GatewayState(Upstreams):
    """The state of one gateway process and the helpers every route uses."""

    def __init__(
        self, settings: Settings, strategy: Strategy, publisher: Publisher | RecorderProcess
    ) -> None:
        check_routable(strategy)
        super().__init__(settings)
        config = self.config
        self.acked = config.durability == "acked"
        self.strategy = strategy
        self.publisher = publisher
        self.calls = CallTable(config.max_open_calls)
        self.stats = GatewayStats()
        self._background: set[asyncio.Task[Any]] = set()
        self._routes: dict[tuple[bool, str, str], Route] = {}

    _json_body = staticmethod(json_body)
    _parse_json = staticmethod(parse_json)
    _call_id = staticmethod(call_id_of)
    _start_event = staticmethod(start_event)

    def _route(self, start: AgentCall) -> Route:
        """The call's decision; one shared object per distinct decision (memory per call)."""
        route = decide_route(self.strategy, start, self.config.mode)
        s = route.selection
        key = (s.selected, s.strategy, s.reason)
        shared = self._routes.get(key)
        if shared is None:
            if len(self._routes) > 1024:  # reasons from a plugin may vary: keep this bounded
                self._routes.clear()
            shared = self._routes[key] = route
        return shared

    def _open_call(
        self, start: AgentCall, path_call: str | None, steps: Iterable[Completion]
    ) -> tuple[CallState, list[AgentCall | Completion]]:
        """The state of ``start``'s call and what this request adds to its records. At a
        call's first request the route is decided (the one decision, on START's attributes)
        and START recorded; a call named in the path is kept in the call table, and the
        request's ``steps`` (tool results) it has not recorded yet are added, each once."""
        call_id = start.call_id
        state = self.calls.get(call_id) if path_call else None
        records: list[AgentCall | Completion] = []
        if state is None:
            route = self._route(start)
            state = CallState(route)
            if path_call:
                self.calls.add(call_id, state)
            start.attributes.update(route.attributes())
            records.append(start)
        if path_call:
            for step in steps:
                if not state.has(step.seq):
                    state.add(step.seq)
                    records.append(step)
        return state, records

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task: asyncio.Task[T] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


    async def _after(self, task: asyncio.Task[int]) -> None:
        await self._on_broker(await asyncio.shield(task))

    def _on_broker(self, position: int) -> Awaitable[None] | None:
        """What an answer waits for once its records up to ``position`` are queued: acked
        mode, the broker's acknowledgement; buffered mode, their hand-over to the recorder
        process's pipe (None: nothing to wait for)."""
        if self.acked:
            return self.publisher.acked(position)
        return self.publisher.handed(position)

    async def _durable(self, ack: Awaitable[Any] | None) -> bool:
        """acked mode: wait (up to ack_timeout_s) for the broker; False when it did not ack.
        Buffered mode: wait for the hand-over to the recorder (none: the records were written
        to its pipe when queued; a wait only while the recorder is behind reading the pipe,
        answered anyway after ack_timeout_s); always True."""
        if ack is None:
            return True
        try:
            await asyncio.wait_for(ack, self.config.ack_timeout_s)
        except TimeoutError:
            if not self.acked:
                self.stats.handover_timeouts += 1
                return True
            self.stats.ack_timeouts += 1
            return False
        return True

    def _not_durable(self, headers: dict[str, str] | None = None) -> web.Response:
        response = openai_error(
            503,
            f"the answer could not be recorded within {self.config.ack_timeout_s:g}s "
            "(gateway.durability = acked; the broker did not acknowledge); retry the request",
            type_="server_error",
            code="recording_unavailable",
        )
        response.headers.update(headers or {})
        return response

