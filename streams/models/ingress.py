"""The records that enter the pipeline: agent calls and their steps (``<p>.agent-events``),
user feedback (``<p>.user-feedback``), and OTLP trace fragments (``<p>.spans``).

May import: pydantic, the standard library and :mod:`streams.models.base`.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .base import (
    AvroModel,
    CallPhase,
    CallStatus,
    Count32,
    Count64,
    FeedbackKind,
    NonEmpty,
    StepKind,
    UtcDateTime,
)

__all__ = [
    "AgentCall",
    "ChatMessage",
    "Completion",
    "SpanRole",
    "ToolCall",
    "TraceFragment",
    "TraceSpan",
    "TrainingMark",
    "UserFeedback",
]


class ToolCall(AvroModel):
    """One tool call an LLM response asked for: OpenAI's ``tool_calls[i]`` of type function."""

    avro_name: ClassVar[str] = "io.trajstream.ToolCall"
    id: str
    name: str
    arguments: str = "{}"


class ChatMessage(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.ChatMessage"
    role: NonEmpty
    content: str = ""
    name: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    reasoning: str | None = None
    """role=assistant: the model's reasoning before the message, apart from its content."""


class TrainingMark(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.TrainingMark"
    labels: list[str] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    task_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    run_id: Annotated[int, Field(ge=0, lt=2**31)] | None = None
    marked_at: UtcDateTime


class AgentCall(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.AgentCall"
    event_id: NonEmpty
    call_id: NonEmpty
    phase: CallPhase
    event_time: UtcDateTime
    operation_name: str = "invoke_agent"
    agent_id: str | None = None
    agent_name: str | None = None
    agent_version: str | None = None
    conversation_id: str | None = None
    input_messages: list[ChatMessage] = Field(default_factory=list)
    output: str | None = None
    status: CallStatus | None = None
    error_type: str | None = None
    step_count: Count32 | None = None
    mark: TrainingMark | None = None
    attributes: dict[str, str] = Field(default_factory=dict)


class Completion(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.Completion"
    event_id: NonEmpty
    call_id: NonEmpty
    seq: Count32
    event_time: UtcDateTime
    kind: StepKind = StepKind.LLM
    operation_name: str = "chat"
    provider_name: str | None = None
    request_model: str | None = None
    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: list[str] = Field(default_factory=list)
    input_tokens: Count64 | None = None
    output_tokens: Count64 | None = None
    input_messages: list[ChatMessage] = Field(default_factory=list)
    output_messages: list[ChatMessage] = Field(default_factory=list)
    tool_name: str | None = None
    tool_calls: list[str] = Field(default_factory=list)
    latency_ms: Annotated[float, Field(ge=0)] | None = None
    tool_call_details: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    upstream: str | None = None
    shadow_response_id: str | None = None
    shadow_output_messages: list[ChatMessage] = Field(default_factory=list)
    shadow_tool_call_details: list[ToolCall] = Field(default_factory=list)
    shadow_latency_ms: Annotated[float, Field(ge=0)] | None = None
    policy_version: int | None = None
    """The version of the policy's weights that answered (Trinity's ``model_version``)."""
    fallback: str | None = None
    """Why production answered a step of a call routed to the policy (None: it did not)."""
    error_type: str | None = None
    """The step failed after part of its answer reached the client (it could not fall back)."""

    @property
    def msg_id(self) -> str | None:
        """The id Trinity knows this step's experience by: its shadow answer's (shadow mode),
        else its own response id, unless production answered it (Trinity never saw that; a
        step that fell back is production's whatever its ``upstream`` says)."""
        if self.shadow_response_id:
            return self.shadow_response_id
        if self.upstream == "production" or self.fallback is not None:
            return None
        return self.response_id


class UserFeedback(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.UserFeedback"
    event_id: NonEmpty
    call_id: NonEmpty
    response_id: str | None = None
    event_time: UtcDateTime
    kind: FeedbackKind
    rating: float | None = None
    rating_min: float = 1.0
    rating_max: float = 5.0
    thumbs_up: bool | None = None
    correction: str | None = None
    preferred_response_id: str | None = None
    user_id: str | None = None
    comment: str | None = None

    @field_validator("rating")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("rating must be a finite number")
        return v

    @model_validator(mode="after")
    def _on_its_scale(self) -> UserFeedback:
        lo, hi = self.rating_min, self.rating_max
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
            raise ValueError(f"rating scale must have rating_min < rating_max, got {lo}..{hi}")
        if self.rating is not None and not lo <= self.rating <= hi:
            raise ValueError(f"rating {self.rating} is outside its scale {lo}..{hi}")
        return self


# -- span resolution (OTLP, otlp.resolve = trace; see streams.core.spans) ---------------------

SpanRole = Literal["agent", "llm", "tool", "plain"]


class TraceSpan(AvroModel):
    """One span of an OTLP export, for the span-resolution stage (see the schema's doc)."""

    avro_name: ClassVar[str] = "io.trajstream.TraceSpan"
    span_id: NonEmpty
    parent_id: str = ""
    role: SpanRole = "plain"
    call_id: str | None = None
    start: AgentCall | None = None
    end: AgentCall | None = None
    step: Completion | None = None


class TraceFragment(AvroModel):
    """The spans of one trace in one export, on ``<p>.spans`` keyed by ``trace_id``."""

    avro_name: ClassVar[str] = "io.trajstream.TraceFragment"
    trace_id: NonEmpty
    received_at: UtcDateTime
    spans: list[TraceSpan] = Field(default_factory=list)
