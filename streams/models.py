"""Pydantic models that mirror the Avro schemas in ``schemas/``, one class per record type.

The Avro schemas are the contract on the wire; these models are how Python code builds and
reads those records, and how JSON-lines input is validated. Field names and types match the
schemas one to one (a unit test checks every class against its schema), so converting is a
plain ``model_dump()`` on the way out and ``model_validate()`` on the way in.

Timestamps are timezone-aware UTC datetimes truncated to milliseconds, the precision of Avro's
``timestamp-millis``; a naive datetime is refused rather than guessed at.

May import: pydantic and the standard library only.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "MODELS",
    "AgentCall",
    "AgentRollout",
    "AvroModel",
    "AwaitingReward",
    "CallPhase",
    "CallStatus",
    "ChatMessage",
    "ClosedCall",
    "CommitHold",
    "CommitRecord",
    "CommitResume",
    "Comparison",
    "Completion",
    "DeadLetter",
    "DriftAlert",
    "FeedbackAck",
    "FeedbackKind",
    "HeldSpan",
    "JudgeRequest",
    "JudgeVerdict",
    "LedgerState",
    "OpenCallEvent",
    "PendingCall",
    "PendingCommit",
    "PendingEvent",
    "PendingEvents",
    "RewardedTrajectory",
    "RoutingOverride",
    "RoutingShare",
    "Selection",
    "SelectionDecision",
    "SpanLink",
    "StepKind",
    "StoredVerdict",
    "Tick",
    "ToolCall",
    "TraceFragment",
    "TraceHead",
    "TraceSpan",
    "TrainingMark",
    "Trajectory",
    "UserFeedback",
    "UtcDateTime",
    "WindowAccumulator",
    "WindowSummary",
    "utcnow",
]


def _to_utc_millis(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp has no timezone; send UTC, e.g. 2026-01-31T12:00:00Z")
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


UtcDateTime = Annotated[datetime, AfterValidator(_to_utc_millis)]
"""A timezone-aware datetime, normalised to UTC at millisecond precision."""


def utcnow() -> datetime:
    """Now, in UTC, at millisecond precision (what survives an Avro round trip)."""
    return _to_utc_millis(datetime.now(UTC))


class CallPhase(StrEnum):
    START = "START"
    END = "END"


class CallStatus(StrEnum):
    OK = "OK"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"


class StepKind(StrEnum):
    LLM = "LLM"
    TOOL = "TOOL"


class FeedbackKind(StrEnum):
    RATING = "RATING"
    THUMBS = "THUMBS"
    CORRECTION = "CORRECTION"
    PREFERENCE = "PREFERENCE"


class AvroModel(BaseModel):
    """Base of every record model: strict about unknown fields, bound to one Avro schema."""

    model_config = ConfigDict(extra="forbid", frozen=False, use_enum_values=False)
    avro_name: ClassVar[str]

    def to_avro(self) -> dict[str, Any]:
        """The record as fastavro writes it."""
        return self.model_dump(mode="python")


NonEmpty = Annotated[str, Field(min_length=1)]
Int32 = Annotated[int, Field(ge=-(2**31), lt=2**31)]
Count32 = Annotated[int, Field(ge=0, lt=2**31)]
Count64 = Annotated[int, Field(ge=0, lt=2**63)]


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

    @property
    def msg_id(self) -> str | None:
        """The id Trinity knows this step's experience by: its shadow answer's (shadow mode),
        else its own response id, unless production answered it (Trinity never saw that)."""
        if self.shadow_response_id:
            return self.shadow_response_id
        return self.response_id if self.upstream != "production" else None


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


class Selection(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.Selection"
    selected: bool
    strategy: str
    reason: str


class Trajectory(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.Trajectory"
    trajectory_id: NonEmpty
    call_id: NonEmpty
    task_id: Annotated[str, Field(min_length=1, max_length=64)]
    run_id: int = 0
    agent_id: str | None = None
    agent_name: str | None = None
    agent_version: str | None = None
    conversation_id: str | None = None
    input_messages: list[ChatMessage] = Field(default_factory=list)
    output: str | None = None
    status: CallStatus | None = None
    error_type: str | None = None
    steps: list[Completion] = Field(default_factory=list)
    mark: TrainingMark | None = None
    selection: Selection
    feedback: list[UserFeedback] = Field(default_factory=list)
    started_at: UtcDateTime | None = None
    ended_at: UtcDateTime
    closed_reason: str = "ended"
    upstream: str | None = None
    """Who answered, as the gateway routed the call (:mod:`streams.core.arms`); None: not
    routed by a gateway."""

    @property
    def msg_ids(self) -> list[str]:
        """Trinity's ids of the LLM steps, in step order: what Trinity calls msg_ids (a shadowed
        step's Trinity answer; never an id production issued, see :attr:`Completion.msg_id`)."""
        return [s.msg_id for s in self.steps if s.kind is StepKind.LLM and s.msg_id]


class RewardedTrajectory(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.RewardedTrajectory"
    trajectory_id: NonEmpty
    call_id: NonEmpty
    task_id: Annotated[str, Field(min_length=1, max_length=64)]
    run_id: int = 0
    msg_ids: list[str]
    reward: float
    components: dict[str, float] = Field(default_factory=dict)
    reward_fn: str
    reward_version: str = "1"
    agent_name: str | None = None
    model: str | None = None
    succeeded: bool = True
    event_time: UtcDateTime
    labels: list[str] = Field(default_factory=list)
    metadata: dict[str, str] = Field(default_factory=dict)
    step_rewards: dict[str, float] = Field(default_factory=dict)
    upstream: str | None = None
    """Who answered: ``trinity``, ``production`` (scored, not sent to Trinity),
    ``trinity-shadow``; None when no gateway routed the call (:mod:`streams.core.arms`)."""

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("reward must be a finite number")
        return v

    @field_validator("step_rewards")
    @classmethod
    def _finite_steps(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k, r in v.items() if not math.isfinite(r)]
        if bad:
            raise ValueError(f"step reward of {bad[0]} must be a finite number")
        return v


class FeedbackAck(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.FeedbackAck"
    rewarded: RewardedTrajectory
    acked_at: UtcDateTime
    attempts: int = 1
    feedbacks: int = 1


class Tick(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.Tick"
    at: UtcDateTime
    source: str = ""
    final: bool = False


class WindowSummary(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.WindowSummary"
    window_start: UtcDateTime
    window_end: UtcDateTime
    agent_name: str
    model: str
    count: int
    mean: float
    min: float
    max: float
    stddev: float
    success_rate: float
    late: int = 0
    emitted_at: UtcDateTime
    upstream: str | None = None


class CommitRecord(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.CommitRecord"
    commit_seq: int
    interval_start: UtcDateTime
    interval_end: UtcDateTime
    feedback_count: int
    reward_mean: float | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    trinity_response: str = ""
    final: bool = False
    sent: bool = True
    experiences: int | None = None
    feedback_requests: int | None = None

    @property
    def held(self) -> bool:
        """Held on a reward drop (``commit.hold_on_drift``), not sent: the reason is in
        ``trinity_response`` as ``{"held": ...}``."""
        if self.sent or not self.trinity_response.startswith("{"):
            return False
        try:
            answer = json.loads(self.trinity_response)
        except ValueError:
            return False
        return isinstance(answer, dict) and "held" in answer

    @property
    def held_reason(self) -> str:
        """Why a held commit was held (empty for others)."""
        return str(json.loads(self.trinity_response)["held"]) if self.held else ""


class DeadLetter(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.DeadLetter"
    reason: str
    error_type: str
    stage: str
    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None = None
    payload: bytes
    failed_at: UtcDateTime
    worker: str = ""


class PendingCall(BaseModel):
    """The assembly's working view of an open call (in memory; stored as PendingEvents)."""

    call_id: NonEmpty
    start: AgentCall | None = None
    end: AgentCall | None = None
    steps: list[Completion] = Field(default_factory=list)
    first_seen: UtcDateTime
    bytes: int = 0
    partition: int = -1


class PendingEvent(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.PendingEvent"
    event_id: str
    kind: int
    seq: int = -1
    step_count: int = -1
    size: int
    data: bytes


class PendingEvents(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.PendingEvents"
    call_id: NonEmpty
    partition: int = -1
    first_seen: UtcDateTime
    events: list[PendingEvent] = Field(default_factory=list)


class OpenCallEvent(AvroModel):
    """One event of an open call as the assembly table stores it (see the schema's doc)."""

    avro_name: ClassVar[str] = "io.trajstream.OpenCallEvent"
    call_id: str = ""
    partition: int = -1
    first_seen: UtcDateTime | None = None
    event_id: str
    kind: int
    seq: int = -1
    step_count: int = -1
    size: int
    data: bytes


class AwaitingReward(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.AwaitingReward"
    call_id: NonEmpty
    partition: int = -1
    trajectory: Trajectory | None = None
    feedback: list[UserFeedback] = Field(default_factory=list)
    since: UtcDateTime
    ready: bool = False
    judge_requested_at: UtcDateTime | None = None


class JudgeRequest(AvroModel):
    """What the LLM judge is asked about one call (see :mod:`streams.core.judge`)."""

    avro_name: ClassVar[str] = "io.trajstream.JudgeRequest"
    call_id: NonEmpty
    trajectory_id: NonEmpty
    model: NonEmpty
    rubric: str
    prompt: str
    prompt_hash: NonEmpty
    requested_at: UtcDateTime


class JudgeVerdict(AvroModel):
    """The judge's verdict on one call: a score in [0, 1], or why there is none."""

    avro_name: ClassVar[str] = "io.trajstream.JudgeVerdict"
    call_id: NonEmpty
    trajectory_id: NonEmpty
    score: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    reason: str = ""
    error: str | None = None
    judge_model: str
    prompt_hash: str
    raw_answer: str = ""
    attempts: Count32 = 1
    requested_at: UtcDateTime
    judged_at: UtcDateTime

    @model_validator(mode="after")
    def _score_or_error(self) -> JudgeVerdict:
        if (self.score is None) == (self.error is None):
            raise ValueError("a verdict has either a score or an error")
        return self


class StoredVerdict(AvroModel):
    """Internal: the verdict the reward stage keeps for a call (see the schema)."""

    avro_name: ClassVar[str] = "io.trajstream.StoredVerdict"
    partition: int = -1
    stored_at: UtcDateTime
    verdict: JudgeVerdict


class WindowAccumulator(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.WindowAccumulator"
    agent_name: str
    model: str
    window_start: UtcDateTime
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    successes: int = 0
    upstream: str | None = None


class PendingCommit(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.PendingCommit"
    seq: int
    step_before: int | None = None
    interval_start: UtcDateTime
    interval_end: UtcDateTime
    count: int
    reward_sum: float
    reward_min: float
    reward_max: float
    final: bool = False
    ready_before: int | None = None
    requests: int = 0


class Comparison(AvroModel):
    """The policy against production for one agent over a window or a trailing span (see the
    schema's doc and :mod:`streams.core.compare`)."""

    avro_name: ClassVar[str] = "io.trajstream.Comparison"
    agent_name: str
    span: Literal["window", "trailing"]
    window_start: UtcDateTime
    window_end: UtcDateTime
    windows: int = 1
    policy_count: int
    policy_mean: float | None = None
    policy_stddev: float | None = None
    production_count: int
    production_mean: float | None = None
    production_stddev: float | None = None
    difference: float | None = None
    lower: float | None = None
    upper: float | None = None
    level: float
    df: float | None = None
    method: str = "welch"
    verdict: Literal["better", "worse", "inconclusive", "insufficient"]
    emitted_at: UtcDateTime


class CommitHold(AvroModel):
    """Commits held because a reward window of one agent and model dropped (nested in
    :class:`LedgerState`)."""

    avro_name: ClassVar[str] = "io.trajstream.CommitHold"
    agent_name: str
    model: str
    threshold: float
    window_start: UtcDateTime
    mean: float
    since: UtcDateTime
    reason: str | None = None
    """None: a reward drop, ended by a recovery; ``rollback``: ended only by an operator."""


class AgentRollout(AvroModel):
    """The policy's share of one agent's traffic (``gateway.rollout``; nested in
    :class:`LedgerState`)."""

    avro_name: ClassVar[str] = "io.trajstream.AgentRollout"
    agent_name: str
    share: float
    version: int = 0
    wins: int = 0
    losses: int = 0
    pinned: bool = False
    rolled_back: bool = False
    updated_at: UtcDateTime | None = None
    streak: list[Comparison] = Field(default_factory=list)


class LedgerState(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.LedgerState"
    next_seq: int = 0
    batch_start: UtcDateTime | None = None
    batch_count: int = 0
    batch_sum: float = 0.0
    batch_min: float = 0.0
    batch_max: float = 0.0
    recent_ids: list[str] = Field(default_factory=list)
    last_commit: UtcDateTime | None = None
    watermark: UtcDateTime | None = None
    last_event: UtcDateTime | None = None
    windows: list[WindowAccumulator] = Field(default_factory=list)
    closed_until: dict[str, int] = Field(default_factory=dict)
    late: dict[str, int] = Field(default_factory=dict)
    applied_offset: int = -1
    pending_commit: PendingCommit | None = None
    trailing: dict[str, list[float]] = Field(default_factory=dict)
    ready_at_last_commit: int | None = None
    holds: list[CommitHold] = Field(default_factory=list)
    batch_requests: int = 0
    arm_windows: list[WindowAccumulator] = Field(default_factory=list)
    rollout: list[AgentRollout] = Field(default_factory=list)


class SelectionDecision(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.SelectionDecision"
    call_id: NonEmpty
    agent_name: str | None = None
    model: str | None = None
    selection: Selection
    closed_reason: str
    steps: int = 0
    marked: bool = False
    ended_at: UtcDateTime | None = None
    decided_at: UtcDateTime


class ClosedCall(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.ClosedCall"
    call_id: NonEmpty
    partition: int = -1
    closed_at: UtcDateTime
    reason: str = "ended"


class CommitResume(AvroModel):
    """An operator's request to resume held commits; accepted only on the ledger topic."""

    avro_name: ClassVar[str] = "io.trajstream.CommitResume"
    agent_name: str | None = None
    model: str | None = None
    requested_at: UtcDateTime
    requested_by: str = ""
    reason: str = ""


class DriftAlert(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.DriftAlert"
    agent_name: str
    model: str
    window_start: UtcDateTime
    window_end: UtcDateTime
    mean: float
    trailing_mean: float
    trailing_windows: int
    fraction: float
    raised_at: UtcDateTime


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


class SpanLink(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.SpanLink"
    span_id: str
    parent_id: str = ""
    role: SpanRole = "plain"
    call_id: str | None = None
    emitted: bool = False


class HeldSpan(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.HeldSpan"
    span_id: str
    at: UtcDateTime
    size: int = 0


class TraceHead(AvroModel):
    """Internal: the span-resolution stage's state of one trace (see the schema's doc)."""

    avro_name: ClassVar[str] = "io.trajstream.TraceHead"
    trace_id: NonEmpty
    partition: int = -1
    first_seen: UtcDateTime
    last_seen: UtcDateTime
    links: list[SpanLink] = Field(default_factory=list)
    held: list[HeldSpan] = Field(default_factory=list)
    ends: list[HeldSpan] = Field(default_factory=list)


class RoutingShare(AvroModel):
    """The policy's share of an agent's traffic from ``effective_at`` on (``<p>.routing``)."""

    avro_name: ClassVar[str] = "io.trajstream.RoutingShare"
    agent_name: str
    share: Annotated[float, Field(ge=0.0, le=1.0)]
    previous_share: float = 0.0
    version: int
    effective_at: UtcDateTime
    decided_at: UtcDateTime
    action: str
    reason: str = ""
    evidence: list[Comparison] = Field(default_factory=list)
    requested_by: str = ""


class RoutingOverride(AvroModel):
    """An operator's pin (share) or release (share None) of an agent's rollout; ledger only."""

    avro_name: ClassVar[str] = "io.trajstream.RoutingOverride"
    agent_name: NonEmpty
    share: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    requested_at: UtcDateTime
    requested_by: str = ""
    reason: str = ""


MODELS: tuple[type[AvroModel], ...] = (
    ToolCall,
    ChatMessage,
    TrainingMark,
    AgentCall,
    Completion,
    UserFeedback,
    Selection,
    Trajectory,
    RewardedTrajectory,
    FeedbackAck,
    Tick,
    WindowSummary,
    CommitRecord,
    DeadLetter,
    PendingEvents,
    OpenCallEvent,
    AwaitingReward,
    LedgerState,
    SelectionDecision,
    ClosedCall,
    DriftAlert,
    CommitResume,
    JudgeRequest,
    JudgeVerdict,
    StoredVerdict,
    TraceSpan,
    TraceFragment,
    SpanLink,
    HeldSpan,
    TraceHead,
    Comparison,
    RoutingShare,
    RoutingOverride,
)
"""Every record model, in dependency order."""
