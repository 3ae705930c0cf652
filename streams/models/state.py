"""The stages' stored state (tables and their changelogs, replay's memory stores): open calls,
trajectories awaiting their reward, stored verdicts, the ledger, the span stage's traces.

May import: pydantic, the standard library and the models below (base, ingress, pipeline).
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import BaseModel, Field

from .base import AvroModel, NonEmpty, UtcDateTime
from .ingress import AgentCall, Completion, SpanRole, UserFeedback
from .pipeline import Comparison, JudgeVerdict, Trajectory

__all__ = [
    "AgentRollout",
    "AwaitingReward",
    "ClosedCall",
    "CommitHold",
    "HeldSpan",
    "LedgerState",
    "OpenCallEvent",
    "PendingCall",
    "PendingCommit",
    "PendingEvent",
    "PendingEvents",
    "SpanLink",
    "StoredVerdict",
    "TraceHead",
    "WindowAccumulator",
]


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


class StoredVerdict(AvroModel):
    """Internal: the verdict the reward stage keeps for a call (see the schema)."""

    avro_name: ClassVar[str] = "io.trajstream.StoredVerdict"
    partition: int = -1
    stored_at: UtcDateTime
    verdict: JudgeVerdict


class ClosedCall(AvroModel):
    avro_name: ClassVar[str] = "io.trajstream.ClosedCall"
    call_id: NonEmpty
    partition: int = -1
    closed_at: UtcDateTime
    reason: str = "ended"


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
    policy_version: int | None = None


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
