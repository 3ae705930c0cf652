"""The records the stages hand on and put out: selection decisions, trajectories, rewards,
acknowledgements, ticks, judge requests and verdicts, reward windows, alerts, comparisons,
routing shares, commits and dead letters.

May import: pydantic, the standard library and the models below (base, ingress).
"""

from __future__ import annotations

import json
import math
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .base import AvroModel, CallStatus, Count32, NonEmpty, StepKind, UtcDateTime
from .ingress import ChatMessage, Completion, TrainingMark, UserFeedback

__all__ = [
    "CommitRecord",
    "Comparison",
    "DeadLetter",
    "DriftAlert",
    "FeedbackAck",
    "JudgeRequest",
    "JudgeVerdict",
    "RewardedTrajectory",
    "RoutingShare",
    "Selection",
    "SelectionDecision",
    "Tick",
    "Trajectory",
    "WindowSummary",
]


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
    """Who answered the call (``streams.core.arms``: ``trinity``, ``production``,
    ``trinity-shadow``, ``trinity-fallback``, ``mixed``); None: not routed by a gateway."""
    policy_version: int | None = None
    """The oldest policy version among the steps Trinity answered; None: none known."""

    @property
    def msg_ids(self) -> list[str]:
        """Trinity's ids of the LLM steps, in step order: what Trinity calls msg_ids (a shadowed
        step's Trinity answer; never an id production issued, see ``Completion.msg_id``)."""
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
    ``trinity-shadow``, ``trinity-fallback`` and ``mixed`` (routed to the policy, answered by
    production in whole or in part: scored, counted, not sent by default); None when no
    gateway routed the call (:mod:`streams.core.arms`)."""
    policy_version: int | None = None
    """The trajectory's policy version (the oldest among its Trinity-answered steps)."""

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
    policy_version: int | None = None


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


class Comparison(AvroModel):
    """The policy against production for one agent over a window or a trailing span (see the
    schema's doc and :mod:`streams.core.compare`)."""

    avro_name: ClassVar[str] = "io.trajstream.Comparison"
    agent_name: str
    span: Literal["window", "trailing", "version"]
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
    policy_version: int | None = None
    """span window: the one version that answered the window's policy calls (None: several, or
    none known); span version: the version compared; span trailing: None."""
    policy_fallbacks: int = 0
    """Calls routed to the policy that production answered from their first request."""
    policy_mixed: int = 0
    """Calls routed to the policy answered in part by production (or broken part way)."""
    fallback_rate: float | None = None
    """(policy_fallbacks + policy_mixed) / the calls routed to the policy; None: none was."""


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
    policy_version: int | None = None
    """The policy version the decision judged (None: an operator's, or none known)."""


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
