"""Replay's bookkeeping, pure: what a replay scored (:class:`Outcome`), its identity, which of
its feedbacks were acknowledged before (``<p>.replayed``), what it sends, and when it commits.

``<p>.replayed`` (compacted, one partition) holds, per replay id: every acknowledged feedback
(key ``<replay_id>|<trajectory_id>``, a :class:`~streams.models.FeedbackAck`), the last commit
(key ``<replay_id>#commit``, a :class:`~streams.models.CommitRecord`) and the replay's commit
ledger (key ``<replay_id>#ledger``, a :class:`~streams.models.LedgerState`: the write-ahead
record of :mod:`streams.core.commits`).

A backfill commits by the workers' own rule: :class:`Backfill` is the ledger stage
(:class:`~streams.core.ledger_stage.LedgerStage`, with its one batch sequence
:func:`~streams.core.ledger_batch.run_batch`) over a state held in memory, one batch per
acknowledged feedback; :func:`backfill_config` gives it replay's pacing (``--commit-every`` as
``max_batch``, ``--commit-interval`` as the interval, and an end that commits what is left).

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from ..codec import SchemaRegistry
from ..errors import ConfigError, ReplayError
from ..models import (
    CommitRecord,
    FeedbackAck,
    LedgerState,
    RewardedTrajectory,
    Trajectory,
    UserFeedback,
)
from .arms import trains, untrained_reason
from .commits import CommitPort
from .compare import CompareConfig
from .effects import Envelope, Out, Reject
from .ledger import CommitPlan, LedgerConfig
from .ledger_batch import run_batch
from .ledger_stage import LedgerStage
from .rollout import RolloutConfig
from .store import MemoryStore

__all__ = [
    "Backfill",
    "BackfillPort",
    "FeedbackPlan",
    "Outcome",
    "ack_key",
    "backfill_config",
    "commit_key",
    "ledger_key",
    "plan_feedback",
    "read_ledger",
    "replay_id",
    "replayed_topic",
    "uncommitted_acks",
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


def uncommitted_acks(records: Iterable[tuple[bytes | None, bytes | None]], rid: str) -> list[bytes]:
    """From the (key, value) records of ``<p>.replayed`` in offset order: the acknowledgements
    recorded under replay ``rid`` after its last commit (those :func:`read_ledger` counts as
    uncommitted), as recorded."""
    head, marker = f"{rid}|".encode(), commit_key(rid)
    acks: list[bytes] = []
    for key, value in records:
        if key == marker:
            acks.clear()
        elif key is not None and key.startswith(head) and value:
            acks.append(value)
    return acks


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
            unsendable.append((rewarded.call_id, untrained_reason(rewarded)))
        elif not rewarded.msg_ids:
            unsendable.append((rewarded.call_id, "no msg_ids (no LLM step with a response id)"))
        else:
            if redactor is not None and redactor.enabled:
                task_id = redactor.redact(rewarded.task_id)[:64] or rewarded.task_id
                rewarded = rewarded.model_copy(update={"task_id": task_id})
            send.append(rewarded)
    return FeedbackPlan(send, skipped, unsendable)


def backfill_config(base: LedgerConfig, every: int | None, interval_s: float) -> LedgerConfig:
    """The ledger configuration of a backfill: the workers' commit rule (aligned intervals of
    ``interval_s``, never an empty commit) with replay's pacing: a batch of ``every``
    acknowledgements commits at once, and the end of the replay commits what is left (no
    successor takes the ledger over). A backfill neither holds its commits nor routes traffic:
    the windows of replayed history decide nothing live."""
    if every is not None and every < 1:
        raise ConfigError(f"--commit-every must be at least 1, got {every}")
    if not interval_s > 0:
        raise ConfigError(f"--commit-interval must be positive, got {interval_s}")
    return replace(
        base,
        interval=timedelta(seconds=interval_s),
        min_batch=1,
        commit_empty=False,
        hold_on_drift=False,
        compare=CompareConfig(),
        rollout=RolloutConfig(enabled=False),
        max_batch=every,
        handover=False,
    )


class BackfillPort(Protocol):
    """What :class:`Backfill` needs of its runner: Trinity, and ``<p>.replayed``."""

    @property
    def trinity(self) -> CommitPort: ...

    async def write_ahead(self, state: LedgerState) -> None:
        """Make ``state`` (with its pending commit) durable before ``/commit`` is sent; every
        acknowledgement recorded before it."""

    async def recorded(self, record: CommitRecord, state: LedgerState) -> None:
        """Record a commit (made, held, not sent or resolved), then ``state`` after it."""


class _MemoryLedger(LedgerStage):
    """The ledger stage over a state kept as an object: nothing to encode between batches."""

    def __init__(self, cfg: LedgerConfig, codec: SchemaRegistry, state: LedgerState) -> None:
        super().__init__(cfg, store=MemoryStore(), codec=codec)
        self.state = state

    def load(self) -> LedgerState:
        return self.state

    def save(self, state: LedgerState) -> None:
        self.state = state

    def exists(self) -> bool:
        return True


class Backfill:
    """Replay's commits to Trinity, by the live ledger's stage and sequence (see the module).

    ``state`` is the replay's ledger as ``<p>.replayed`` had it (None: it never committed).
    Call :meth:`resume` first, :meth:`acked` with each acknowledgement as it was recorded on
    ``<p>.replayed``, and :meth:`close` at the end; :attr:`records` holds the commits made.
    A commit that Trinity did not take raises :class:`~streams.errors.ReplayError` (re-running
    the replay resumes it).
    """

    def __init__(
        self,
        cfg: LedgerConfig,
        port: BackfillPort,
        *,
        codec: SchemaRegistry,
        state: LedgerState | None,
        clock: Callable[[], datetime],
    ) -> None:
        state = state.model_copy(deep=True) if state is not None else LedgerState()
        self.stage = _MemoryLedger(cfg, codec, state)
        self.port = port
        self.clock = clock
        self.records: list[CommitRecord] = []
        self.plans: list[CommitPlan] = []
        """Every commit plan made (not those resolved from an earlier run)."""
        self.rejects: list[Reject] = []

    @property
    def state(self) -> LedgerState:
        return self.stage.state

    async def resume(self, uncommitted: Sequence[Envelope] = ()) -> None:
        """The first batch: resolve a commit an earlier run left in flight, and apply the
        acknowledgements it recorded after its last commit (``uncommitted``, see
        :func:`uncommitted_acks`, opened at the edge), unless that commit in flight carries
        them already (they were applied before it was written ahead)."""
        carried = self.state.pending_commit is not None
        await self._batch([] if carried else list(uncommitted))

    async def acked(self, ack: FeedbackAck) -> None:
        """One acknowledgement (as recorded on ``<p>.replayed``): commits when the rule says
        so."""
        await self._batch([Envelope.handed(ack, 0)])

    async def close(self) -> None:
        """The end of the replay: commit whatever is left."""
        await self._batch([], closing=True)

    async def _batch(self, records: list[Envelope], *, closing: bool = False) -> None:
        first = self.state.applied_offset + 1  # each acknowledgement applied once, in order
        batch = [replace(env, offset=first + i) for i, env in enumerate(records)]

        async def read(state: LedgerState) -> list[Envelope]:
            return batch

        done = await run_batch(self.stage, _Port(self), read, self.clock, closing=closing)
        self.rejects.extend(done.applied.rejects)


class _Port:
    """The ledger sequence's port (:class:`~streams.core.ledger_batch.LedgerPort`) of a
    backfill: the windows and alerts it decides are replayed history, sent nowhere."""

    def __init__(self, backfill: Backfill) -> None:
        self.backfill = backfill

    @property
    def trinity(self) -> CommitPort:
        return self.backfill.port.trinity

    async def send_decided(self, out: Out) -> None:
        pass

    async def write_ahead(self, state: LedgerState) -> None:
        await self.backfill.port.write_ahead(state)

    async def recorded(self, record: CommitRecord | None, plan: CommitPlan | None) -> None:
        if record is None:
            raise ReplayError(
                "commit: Trinity failed; re-run the replay to commit"
                if plan is not None
                else "cannot resolve the interrupted commit; re-run the replay"
            )
        if plan is not None:
            self.backfill.plans.append(plan)
        self.backfill.records.append(record)
        await self.backfill.port.recorded(record, self.backfill.state)
