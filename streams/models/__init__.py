"""Pydantic models that mirror the Avro schemas in ``schemas/``, one class per record type.

The package holds them by role, and re-exports every one (``from streams.models import X``):
:mod:`~streams.models.base` (the base class, timestamps, enums), :mod:`~streams.models.ingress`
(what enters: agent events, user feedback, trace fragments), :mod:`~streams.models.pipeline`
(what the stages hand on and put out), :mod:`~streams.models.state` (the stages' stored state),
:mod:`~streams.models.operations` (operators' records on the ledger).

The Avro schemas are the contract on the wire; these models are how Python code builds and
reads those records, and how JSON-lines input is validated. Field names and types match the
schemas one to one (a unit test checks every class against its schema), so converting is a
plain ``model_dump()`` on the way out and ``model_validate()`` on the way in.

Timestamps are timezone-aware UTC datetimes truncated to milliseconds, the precision of Avro's
``timestamp-millis``; a naive datetime is refused rather than guessed at.

May import: pydantic and the standard library only (each module: those below it).
"""

from __future__ import annotations

from .base import (
    AvroModel,
    CallPhase,
    CallStatus,
    Count32,
    Count64,
    FeedbackKind,
    Int32,
    NonEmpty,
    StepKind,
    UtcDateTime,
    utcnow,
)
from .ingress import (
    AgentCall,
    ChatMessage,
    Completion,
    SpanRole,
    ToolCall,
    TraceFragment,
    TraceSpan,
    TrainingMark,
    UserFeedback,
)
from .operations import (
    CommitResume,
    RoutingOverride,
)
from .pipeline import (
    CommitRecord,
    Comparison,
    DeadLetter,
    DriftAlert,
    FeedbackAck,
    JudgeRequest,
    JudgeVerdict,
    RewardedTrajectory,
    RoutingShare,
    Selection,
    SelectionDecision,
    Tick,
    Trajectory,
    WindowSummary,
)
from .state import (
    AgentRollout,
    AwaitingReward,
    ClosedCall,
    CommitHold,
    HeldSpan,
    LedgerState,
    OpenCallEvent,
    PendingCall,
    PendingCommit,
    PendingEvent,
    PendingEvents,
    SpanLink,
    StoredVerdict,
    TraceHead,
    WindowAccumulator,
)

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
    "Count32",
    "Count64",
    "DeadLetter",
    "DriftAlert",
    "FeedbackAck",
    "FeedbackKind",
    "HeldSpan",
    "Int32",
    "JudgeRequest",
    "JudgeVerdict",
    "LedgerState",
    "NonEmpty",
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
    "SpanRole",
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
