"""Replay's bookkeeping, pure: what a replay scored (:class:`Outcome`), its identity, which of
its feedbacks were acknowledged before (``<p>.replayed``), what it sends, and when it commits.

``<p>.replayed`` (compacted, one partition) holds, per replay id: every acknowledged feedback
(key ``<replay_id>|<trajectory_id>``, a :class:`~streams.models.FeedbackAck`), the last commit
(key ``<replay_id>#commit``, a :class:`~streams.models.CommitRecord`) and the replay's commit
ledger (key ``<replay_id>#ledger``, a :class:`~streams.models.LedgerState`: the write-ahead
record of :mod:`streams.core.commits`).

May import: the standard library, :mod:`streams.models`, :mod:`streams.errors`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from ..errors import ConfigError
from ..models import RewardedTrajectory, Trajectory, UserFeedback
from .arms import trains

__all__ = [
    "CommitPacer",
    "FeedbackPlan",
    "Outcome",
    "ack_key",
    "commit_key",
    "ledger_key",
    "plan_feedback",
    "read_ledger",
    "replay_id",
    "replayed_topic",
]


class TaskRedactor(Protocol):
    """What :func:`plan_feedback` needs of :class:`streams.export.redact.Redactor`."""

    enabled: bool

    def redact(self, text: str) -> str: ...


@dataclass
class Outcome:
    """A selected call of the range: its trajectory and what each reward function made of it."""

    trajectory: Trajectory
    """As the assemble stage closed it (no feedback): the record live workers put on
    ``<p>.trajectories``."""
    closed_at: datetime
    partition: int
    rewards: list[RewardedTrajectory | None]
    """One per reward function (the primary first); None when not scored."""
    errors: list[str | None]
    attached: list[list[UserFeedback]]
    """The user feedback each reward function was given (the live reward stage's rule)."""
    feedback: list[UserFeedback] = field(default_factory=list)
    """Every user feedback of the call in the range, also after scoring (for exports)."""
    unscored: str | None = None
    """Why it was not scored: closed abandoned or oversized (``reward.score_incomplete``)."""

    @property
    def call_id(self) -> str:
        return self.trajectory.call_id

    def scored_trajectory(self, index: int = 0) -> Trajectory:
        """The trajectory as reward function ``index`` saw it, with its feedback attached."""
        return self.trajectory.model_copy(update={"feedback": list(self.attached[index])})


def replay_id(prefix: str, strategy: str, reward: str, reward_version: str) -> str:
    """The replay's identity: what decides whether two replays would send the same feedback.

    The source prefix, the strategy's canonical name and the reward function with its version;
    not the range, so an overlapping or open-ended ("until now") replay skips what an earlier
    one already sent.
    """
    spec = json.dumps([prefix, strategy, reward, reward_version], separators=(",", ":"))
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def replayed_topic(prefix: str) -> str:
    """The topic recording every feedback a replay got acknowledged (compacted, 1 partition)."""
    return f"{prefix}.replayed"


def ack_key(rid: str, trajectory_id: str) -> bytes:
    """Key of an acknowledged feedback on ``<p>.replayed``."""
    return f"{rid}|{trajectory_id}".encode()


def commit_key(rid: str) -> bytes:
    """Key of the last commit a replay sent (compaction keeps only the latest)."""
    return f"{rid}#commit".encode()


def ledger_key(rid: str) -> bytes:
    """Key of a replay's commit ledger (the write-ahead record of its commits)."""
    return f"{rid}#ledger".encode()


def read_ledger(keys: Iterable[bytes | None], rid: str) -> tuple[set[str], int]:
    """From the keys of ``<p>.replayed`` in offset order: the trajectory ids acknowledged under
    replay ``rid``, and how many of them came after its last commit (an interrupted run:
    acknowledged, not committed yet)."""
    head, marker = f"{rid}|".encode(), commit_key(rid)
    acknowledged: set[str] = set()
    uncommitted = 0
    for key in keys:
        if key == marker:
            uncommitted = 0
        elif key is not None and key.startswith(head):
            acknowledged.add(key[len(head) :].decode())
            uncommitted += 1
    return acknowledged, uncommitted


@dataclass(frozen=True)
class FeedbackPlan:
    send: list[RewardedTrajectory]
    skipped: list[str]
    """Trajectory ids acknowledged before under the same replay id."""
    unsendable: list[tuple[str, str]]
    """(call_id, why): e.g. no LLM step with a response id, so no msg_ids to reward."""


def plan_feedback(
    scored: Iterable[RewardedTrajectory],
    acknowledged: set[str],
    redactor: TaskRedactor | None = None,
) -> FeedbackPlan:
    """What a replay to Trinity sends: every rewarded trajectory not acknowledged before, with
    its task_id redacted when asked."""
    send: list[RewardedTrajectory] = []
    skipped: list[str] = []
    unsendable: list[tuple[str, str]] = []
    for rewarded in scored:
        if rewarded.trajectory_id in acknowledged:
            skipped.append(rewarded.trajectory_id)
        elif not trains(rewarded):
            unsendable.append((rewarded.call_id, "answered by production: scored, not trained"))
        elif not rewarded.msg_ids:
            unsendable.append((rewarded.call_id, "no msg_ids (no LLM step with a response id)"))
        else:
            if redactor is not None and redactor.enabled:
                task_id = redactor.redact(rewarded.task_id)[:64] or rewarded.task_id
                rewarded = rewarded.model_copy(update={"task_id": task_id})
            send.append(rewarded)
    return FeedbackPlan(send, skipped, unsendable)


class CommitPacer:
    """When to commit: after every ``every`` acknowledged feedbacks, or when ``interval``
    seconds have passed since the last commit with at least one acknowledged, and at the end
    if anything is left; never an empty commit."""

    def __init__(self, every: int | None, interval: float | None, now: float = 0.0) -> None:
        if every is not None and every < 1:
            raise ConfigError(f"--commit-every must be at least 1, got {every}")
        if interval is not None and not interval > 0:
            raise ConfigError(f"--commit-interval must be positive, got {interval}")
        self.every = every
        self.interval = interval
        self.pending = 0
        self._since = now

    def acked(self, now: float) -> bool:
        """One more feedback acknowledged; True when a commit is due now."""
        self.pending += 1
        if self.every is not None and self.pending >= self.every:
            return True
        return self.interval is not None and now - self._since >= self.interval

    def committed(self, now: float) -> None:
        self.pending = 0
        self._since = now

    def final(self) -> bool:
        return self.pending > 0
