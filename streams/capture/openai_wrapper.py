"""Capture without a proxy: the official ``openai`` clients (sync and async), wrapped.

For Python agents that cannot go through the gateway. A call is routed by the same decision as
the gateway's (:func:`~.routing.decide_route`, the workers' strategy at the call's start) and
its steps are recorded exactly as the gateway records them (:mod:`.chat`: the same seqs, tool
calls with ids and arguments, tool results from the next request's ``tool`` messages), through
the same bounded, spilling :class:`~.publisher.Publisher`, run on a background thread so that
neither sync nor async agents ever wait for Kafka::

    capture = TrajstreamCapture.from_settings(load_settings())      # starts its thread
    production = openai.OpenAI()                                     # or AsyncOpenAI
    trinity = openai.OpenAI(base_url="http://trinity:8010/v1", api_key="unused")
    with capture.call(agent_name="support", mark=None) as call:
        client = call.wrap(production, trinity)       # Trinity when the call is selected
        reply = client.chat.completions.create(model="gpt-4o", messages=[...])
        call.output = reply.choices[0].message.content
    capture.close()                                    # publishes what is queued

Leaving the block publishes END (OK, or ERROR with the exception's type). ``async with`` works
the same way with ``openai.AsyncOpenAI`` clients. Route mode only: shadow runs are the gateway's.
Anything else on the wrapped client (``client.models``, ``client.embeddings``, ...) is the
chosen client's, unrecorded.

This module imports the models, settings, selection, and its siblings in ``capture``; the
``openai`` package is used only through the clients handed to it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer

from ..core.select import Strategy, build_strategy
from ..io import kafka, registry
from ..models import AgentCall, CallPhase, CallStatus, Completion, TrainingMark, utcnow
from ..settings import KafkaSecuritySettings, SchemaRegistrySettings, Settings
from .chat import StreamAssembler, llm_step, steps_of_request, to_chat_message
from .publisher import Publisher
from .routing import Route, check_routable, decide_route
from .sdk import default_topics

__all__ = ["CapturedCall", "TrajstreamCapture"]

_NOT_BODY = {"extra_headers", "extra_query", "extra_body", "timeout"}


class TrajstreamCapture:
    """A publisher on a background thread, and the routing strategy; makes ``CapturedCall``."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        strategy: Strategy | str = "sampling:0.1",
        topic_prefix: str | None = None,
        partitions: int | None = None,
        spill_dir: Path = Path(".cache/trajstream/capture-spill"),
        buffer_records: int = 10_000,
        flush_timeout_s: float = 10.0,
        security: KafkaSecuritySettings | None = None,
        schema_registry: SchemaRegistrySettings | None = None,
    ) -> None:
        self.strategy = build_strategy(strategy) if isinstance(strategy, str) else strategy
        check_routable(self.strategy, strategy if isinstance(strategy, str) else "")
        self.flush_timeout_s = flush_timeout_s
        topics = default_topics(topic_prefix, partitions)  # unset: as the settings say
        # with a registry (settings.kafka.schema_registry): the subjects checked here, at
        # construction, and the records written in Confluent's wire format
        registered = registry.connect(
            schema_registry, topics=topics, writes=[topics.agent_events, topics.user_feedback]
        )
        framing = registered.framing if registered else None

        def producer() -> AIOKafkaProducer:
            return kafka.producer(
                bootstrap_servers,
                security,
                framing=framing,
                request_timeout_ms=int(flush_timeout_s * 1000),
            )

        async def prepare() -> None:
            await kafka.create_topics(
                bootstrap_servers, topics.all(), security=security, configs=topics.configs()
            )

        self._loop = asyncio.new_event_loop()
        self.publisher = Publisher(
            producer, topics, spill_dir=spill_dir, max_buffered=buffer_records, prepare=prepare
        )
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="trajstream-capture"
        )
        self._thread.start()
        self._submit(self.publisher.start()).result(timeout=10)
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings) -> TrajstreamCapture:
        bootstrap = settings.bootstrap_servers
        if not bootstrap:
            from ..errors import ConfigError

            raise ConfigError(
                "kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS] is not set"
            )
        strategy = build_strategy(
            settings.selection.strategy,
            rate=settings.selection.rate,
            mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
        )
        return cls(
            bootstrap,
            strategy=strategy,
            topic_prefix=settings.kafka.topic_prefix,
            partitions=settings.kafka.partitions,
            spill_dir=settings.gateway.spill_dir / "wrapper",
            buffer_records=settings.gateway.buffer_records,
            flush_timeout_s=settings.gateway.flush_timeout_s,
            security=settings.kafka.security,
            schema_registry=settings.kafka.schema_registry,
        )

    def _submit(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def emit(self, record: AgentCall | Completion) -> None:
        """Queue one record; returns at once, from any thread (order of calls is kept)."""
        self._loop.call_soon_threadsafe(self.publisher.publish, record)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything queued is on the broker (False on timeout)."""
        timeout = self.flush_timeout_s if timeout is None else timeout
        return bool(self._submit(self.publisher.flush(timeout)).result(timeout + 5))

    def close(self) -> None:
        """Publish what is queued (spill the rest to disk) and stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._submit(self.publisher.stop(self.flush_timeout_s)).result(self.flush_timeout_s + 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> TrajstreamCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        *,
        call_id: str | None = None,
        agent_name: str | None = None,
        agent_id: str | None = None,
        agent_version: str | None = None,
        conversation_id: str | None = None,
        mark: TrainingMark | None = None,
        attributes: dict[str, str] | None = None,
    ) -> CapturedCall:
        """One agent call; its route is decided now, once."""
        cid = call_id or uuid.uuid4().hex
        start = AgentCall(
            event_id=f"{cid}/start",
            call_id=cid,
            phase=CallPhase.START,
            event_time=utcnow(),
            agent_id=agent_id,
            agent_name=agent_name,
            agent_version=agent_version,
            conversation_id=conversation_id,
            mark=mark,
            attributes=dict(attributes or {}),
        )
        route = decide_route(self.strategy, start, "route")
        start.attributes.update(route.attributes())
        return CapturedCall(self, start, route)


class CapturedCall:
    """The open call: wrap clients with ``wrap()``; ``end()`` (or leaving the block) ends it."""

    def __init__(self, capture: TrajstreamCapture, start: AgentCall, route: Route) -> None:
        self._capture = capture
        self.start = start
        self.route = route
        self.output: str | None = None
        self._seqs: set[int] = set()
        self._started = False
        self._ended = False
        self._lock = threading.Lock()

    @property
    def call_id(self) -> str:
        return self.start.call_id

    @property
    def selected(self) -> bool:
        return self.route.selection.selected

    def wrap(self, production: Any, trinity: Any) -> Any:
        """The client this call uses: ``trinity`` when selected, else ``production``, recorded.

        Both must be sync (``openai.OpenAI``) or both async (``openai.AsyncOpenAI``).
        """
        chosen = trinity if self.route.upstream == "trinity" else production
        import openai

        if isinstance(chosen, openai.AsyncOpenAI):
            return _AsyncClient(chosen, self)
        return _SyncClient(chosen, self)

    # -- recording (shared by both clients) ----------------------------------------------------

    def _before(self, body: dict[str, Any]) -> None:
        messages = body["messages"]
        with self._lock:
            if not self._started:
                self._started = True
                self.start.input_messages = [to_chat_message(m) for m in messages]
                self._capture.emit(self.start)
            for step in steps_of_request(self.call_id, messages, utcnow()):
                if step.seq not in self._seqs:
                    self._seqs.add(step.seq)
                    self._capture.emit(step)

    def _after(self, body: dict[str, Any], answer: dict[str, Any], began: float) -> None:
        step = llm_step(
            self.call_id,
            body,
            answer,
            upstream=self.route.upstream,
            latency_ms=(time.perf_counter() - began) * 1000,
            now=utcnow(),
        )
        with self._lock:
            if step.seq not in self._seqs:
                self._seqs.add(step.seq)
                self._capture.emit(step)

    def end(
        self,
        status: CallStatus = CallStatus.OK,
        *,
        output: str | None = None,
        error_type: str | None = None,
    ) -> None:
        """Publish END (once) with the number of steps recorded."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            if not self._started:
                self._started = True
                self._capture.emit(self.start)
            self._capture.emit(
                self.start.model_copy(
                    update={
                        "event_id": f"{self.call_id}/end",
                        "phase": CallPhase.END,
                        "event_time": utcnow(),
                        "input_messages": [],
                        "status": status,
                        "output": output if output is not None else self.output,
                        "error_type": error_type,
                        "step_count": len(self._seqs),
                    }
                )
            )

    def _exit(self, exc_type: type[BaseException] | None) -> None:
        if exc_type is None:
            self.end()
        elif issubclass(exc_type, asyncio.CancelledError):
            self.end(CallStatus.CANCELLED)
        else:
            self.end(CallStatus.ERROR, error_type=exc_type.__name__)

    def __enter__(self) -> CapturedCall:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc_type)

    async def __aenter__(self) -> CapturedCall:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc_type)


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _body(kwargs: dict[str, Any]) -> dict[str, Any]:
    body = {k: _plain(v) for k, v in kwargs.items() if k not in _NOT_BODY}
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise ValueError("messages must be a list of messages with a role")
    return body


class _Passthrough:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _SyncClient(_Passthrough):
    def __init__(self, inner: Any, call: CapturedCall) -> None:
        super().__init__(inner)
        self.chat = _Passthrough(inner.chat)
        self.chat.completions = _SyncCompletions(inner.chat.completions, call)


class _AsyncClient(_Passthrough):
    def __init__(self, inner: Any, call: CapturedCall) -> None:
        super().__init__(inner)
        self.chat = _Passthrough(inner.chat)
        self.chat.completions = _AsyncCompletions(inner.chat.completions, call)


class _SyncCompletions(_Passthrough):
    def __init__(self, inner: Any, call: CapturedCall) -> None:
        super().__init__(inner)
        self._call = call

    def create(self, **kwargs: Any) -> Any:
        body = _body(kwargs)
        self._call._before(body)
        began = time.perf_counter()
        result = self._inner.create(**kwargs)
        if body.get("stream"):
            return _SyncStream(result, self._call, body, began)
        self._call._after(body, result.model_dump(), began)
        return result


class _AsyncCompletions(_Passthrough):
    def __init__(self, inner: Any, call: CapturedCall) -> None:
        super().__init__(inner)
        self._call = call

    async def create(self, **kwargs: Any) -> Any:
        body = _body(kwargs)
        self._call._before(body)
        began = time.perf_counter()
        result = await self._inner.create(**kwargs)
        if body.get("stream"):
            return _AsyncStream(result, self._call, body, began)
        self._call._after(body, result.model_dump(), began)
        return result


class _StreamBase(_Passthrough):
    def __init__(self, inner: Any, call: CapturedCall, body: dict[str, Any], began: float) -> None:
        super().__init__(inner)
        self._record: Callable[[], None] = lambda: call._after(
            body, self._assembler.completion(), began
        )
        self._assembler = StreamAssembler()

    def _chunk(self, chunk: Any) -> Any:
        self._assembler.add_chunk(chunk.model_dump())
        return chunk


class _SyncStream(_StreamBase):
    def __iter__(self) -> Iterator[Any]:
        for chunk in self._inner:
            yield self._chunk(chunk)
        self._record()  # recorded once the stream is complete

    def __enter__(self) -> _SyncStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.close()


class _AsyncStream(_StreamBase):
    async def __aiter__(self) -> AsyncIterator[Any]:
        async for chunk in self._inner:
            yield self._chunk(chunk)
        self._record()

    async def __aenter__(self) -> _AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.close()
