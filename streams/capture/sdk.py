"""The producer SDK: what agent code uses to publish its calls, steps and user feedback.

Every record is keyed by its ``call_id``, so a call's events land on one partition in the order
they were sent and the workers never repartition. Records are Avro single-object encoded.

Example::

    async with TrajstreamProducer("localhost:9092") as ts:
        async with ts.call(agent_name="support", input_messages=[user("Where is my order?")],
                           mark=TrainingMark(labels=["gold"], marked_at=utcnow())) as call:
            reply = await openai_client.chat.completions.create(...)   # e.g. via Trinity
            await call.completion(response_id=reply.id, response_model=reply.model, ...)
            await call.tool("lookup_order", output="shipped")
            call.output = "Your order shipped yesterday."
        await ts.feedback(call.call_id, rating=5)

Leaving the ``call`` block publishes the END event with the number of steps, with status OK, or
ERROR (and the exception's type) when the block raised, or CANCELLED when it was cancelled.

May import: aiokafka (clients built by :mod:`streams.io.kafka`), the top-level modules.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer

from ..codec import SchemaRegistry
from ..io import kafka, registry
from ..models import (
    AgentCall,
    AvroModel,
    CallPhase,
    CallStatus,
    ChatMessage,
    Completion,
    FeedbackKind,
    StepKind,
    TraceFragment,
    TrainingMark,
    UserFeedback,
    utcnow,
)
from ..settings import KafkaSecuritySettings, SchemaRegistrySettings, Settings, current_settings
from ..topics import Topics
from ..wire import TopicFraming

__all__ = [
    "CallRecorder",
    "TrajstreamProducer",
    "default_topics",
    "key_of",
    "new_id",
    "topic_for",
]


def new_id() -> str:
    return uuid.uuid4().hex


def topic_for(record: AvroModel, topics: Topics) -> str:
    """The topic a record of this type is published on."""
    if isinstance(record, AgentCall | Completion):
        return topics.agent_events
    if isinstance(record, UserFeedback):
        return topics.user_feedback
    if isinstance(record, TraceFragment):
        return topics.spans
    raise TypeError(f"{type(record).__name__} is not published by agents")


def default_topics(topic_prefix: str | None, partitions: int | None) -> Topics:
    """The topics of a client built without a settings object: what is not given follows the
    settings this process loads (``kafka.topic_prefix`` [TRAJSTREAM_KAFKA__TOPIC_PREFIX] and
    ``kafka.partitions``, from the environment or the config file), so a client and the workers
    configured alike write and read the same topics. A bad setting raises ConfigError naming it."""
    if topic_prefix is None or partitions is None:
        kafka_settings = current_settings().kafka
        topic_prefix = kafka_settings.topic_prefix if topic_prefix is None else topic_prefix
        partitions = kafka_settings.partitions if partitions is None else partitions
    return Topics(topic_prefix, partitions)


def key_of(record: AgentCall | Completion | UserFeedback | TraceFragment) -> bytes:
    """The record's key: its call_id (a trace fragment: its trace id)."""
    if isinstance(record, TraceFragment):
        return record.trace_id.encode()
    return record.call_id.encode()


class TrajstreamProducer:
    """Publishes agent events to Kafka. Use as an async context manager.

    ``topic_prefix`` and ``partitions`` left unset follow the settings this process loads
    (``kafka.topic_prefix``, e.g. TRAJSTREAM_KAFKA__TOPIC_PREFIX, default ``trajstream``; and
    ``kafka.partitions``): see :func:`default_topics`.
    ``security`` (TLS, SASL) is ``settings.kafka.security``; unset: PLAINTEXT.
    ``schema_registry`` is ``settings.kafka.schema_registry``: when set, ``start()``
    registers the agent-events and user-feedback subjects (checking their compatibility
    level) and records are written in Confluent's wire format.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topic_prefix: str | None = None,
        partitions: int | None = None,
        codec: SchemaRegistry | None = None,
        producer: AIOKafkaProducer | None = None,
        security: KafkaSecuritySettings | None = None,
        schema_registry: SchemaRegistrySettings | None = None,
    ) -> None:
        self.topics = default_topics(topic_prefix, partitions)
        self.codec = codec or SchemaRegistry.default()
        self._producer = producer or kafka.producer(bootstrap_servers, security)
        self._schema_registry = schema_registry
        self._framing: TopicFraming | None = None

    @classmethod
    def from_settings(cls, settings: Settings, bootstrap_servers: str) -> TrajstreamProducer:
        """A producer for ``bootstrap_servers`` with the topics, security and schema registry
        of ``settings.kafka``."""
        k = settings.kafka
        return cls(
            bootstrap_servers,
            topic_prefix=k.topic_prefix,
            partitions=k.partitions,
            security=k.security,
            schema_registry=k.schema_registry,
        )

    async def start(self) -> None:
        if self._schema_registry is not None and self._framing is None:
            registered = await registry.aconnect(
                self._schema_registry,
                topics=self.topics,
                writes=[self.topics.agent_events, self.topics.user_feedback, self.topics.spans],
                codec=self.codec,
            )
            self._framing = registered.framing if registered else None
        await self._producer.start()

    def _value(
        self, topic: str, record: AgentCall | Completion | UserFeedback | TraceFragment
    ) -> bytes:
        data = self.codec.encode(record)
        return self._framing.reframe(topic, data) if self._framing else data

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> TrajstreamProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def publish(
        self, record: AgentCall | Completion | UserFeedback, *, wait: bool = True
    ) -> None:
        """Publish one record, keyed by its call_id. ``wait=False`` returns once it is queued."""
        topic = topic_for(record, self.topics)
        future = await self._producer.send(
            topic, key=key_of(record), value=self._value(topic, record)
        )
        if wait:
            await future

    async def publish_many(
        self, records: Sequence[AgentCall | Completion | UserFeedback | TraceFragment]
    ) -> None:
        """Publish records in order and wait until the broker has all of them."""
        futures = []
        for r in records:
            topic = topic_for(r, self.topics)
            value = self._value(topic, r)
            futures.append(await self._producer.send(topic, key=key_of(r), value=value))
        await asyncio.gather(*futures)

    async def flush(self) -> None:
        await self._producer.flush()

    def call(
        self,
        *,
        call_id: str | None = None,
        agent_name: str | None = None,
        agent_id: str | None = None,
        agent_version: str | None = None,
        conversation_id: str | None = None,
        input_messages: Sequence[ChatMessage] = (),
        mark: TrainingMark | None = None,
        attributes: dict[str, str] | None = None,
    ) -> CallRecorder:
        """Record one agent call: START now, steps as they happen, END when the block exits."""
        return CallRecorder(
            self,
            AgentCall(
                event_id=new_id(),
                call_id=call_id or new_id(),
                phase=CallPhase.START,
                event_time=utcnow(),
                agent_id=agent_id,
                agent_name=agent_name,
                agent_version=agent_version,
                conversation_id=conversation_id,
                input_messages=list(input_messages),
                mark=mark,
                attributes=attributes or {},
            ),
        )

    async def feedback(
        self,
        call_id: str,
        *,
        rating: float | None = None,
        rating_scale: tuple[float, float] = (1.0, 5.0),
        thumbs_up: bool | None = None,
        correction: str | None = None,
        preferred_response_id: str | None = None,
        response_id: str | None = None,
        user_id: str | None = None,
        comment: str | None = None,
        event_time: datetime | None = None,
    ) -> UserFeedback:
        """Publish a user's judgement of a call (or of one of its responses)."""
        if rating is not None:
            kind = FeedbackKind.RATING
        elif thumbs_up is not None:
            kind = FeedbackKind.THUMBS
        elif correction is not None:
            kind = FeedbackKind.CORRECTION
        elif preferred_response_id is not None:
            kind = FeedbackKind.PREFERENCE
        else:
            raise ValueError(
                "feedback needs a rating, thumbs_up, correction or preferred_response_id"
            )
        record = UserFeedback(
            event_id=new_id(),
            call_id=call_id,
            response_id=response_id,
            event_time=event_time or utcnow(),
            kind=kind,
            rating=rating,
            rating_min=rating_scale[0],
            rating_max=rating_scale[1],
            thumbs_up=thumbs_up,
            correction=correction,
            preferred_response_id=preferred_response_id,
            user_id=user_id,
            comment=comment,
        )
        await self.publish(record)
        return record


class CallRecorder:
    """The open call inside ``async with producer.call(...)``."""

    def __init__(self, producer: TrajstreamProducer, start: AgentCall):
        self._producer = producer
        self.start = start
        self.steps = 0
        self.output: str | None = None

    @property
    def call_id(self) -> str:
        return self.start.call_id

    async def __aenter__(self) -> CallRecorder:
        await self._producer.publish(self.start, wait=False)
        return self

    async def completion(self, **fields: Any) -> Completion:
        """Record one LLM response: response_id (the chatcmpl- id), models, tokens, messages."""
        return await self._step(StepKind.LLM, fields)

    async def tool(self, tool_name: str, *, output: str = "", **fields: Any) -> Completion:
        """Record one tool execution."""
        fields.setdefault("operation_name", "execute_tool")
        fields.setdefault(
            "output_messages", [ChatMessage(role="tool", content=output, name=tool_name)]
        )
        return await self._step(StepKind.TOOL, {"tool_name": tool_name, **fields})

    async def _step(self, kind: StepKind, fields: dict[str, Any]) -> Completion:
        record = Completion(
            event_id=new_id(),
            call_id=self.call_id,
            seq=self.steps,
            event_time=fields.pop("event_time", None) or utcnow(),
            kind=kind,
            **fields,
        )
        self.steps += 1
        await self._producer.publish(record, wait=False)
        return record

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            status, error = CallStatus.OK, None
        elif issubclass(exc_type, asyncio.CancelledError):
            status, error = CallStatus.CANCELLED, None
        else:
            status, error = CallStatus.ERROR, exc_type.__name__
        s = self.start
        end = AgentCall(
            event_id=new_id(),
            call_id=self.call_id,
            phase=CallPhase.END,
            event_time=utcnow(),
            agent_id=s.agent_id,
            agent_name=s.agent_name,
            agent_version=s.agent_version,
            conversation_id=s.conversation_id,
            output=self.output,
            status=status,
            error_type=error,
            step_count=self.steps,
            mark=s.mark,
        )
        await self._producer.publish(end)
