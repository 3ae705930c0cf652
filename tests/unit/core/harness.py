"""A broker-free harness for the core: its stages over in-memory stores, a fake clock, and a
scripted Trinity for the commit protocol.

Nothing here imports Faust, Kafka or HTTP: the same step functions the runners call are driven
record by record, with every timestamp derived from :data:`tests.unit.factories.T0`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from streams.codec import SchemaRegistry
from streams.core.assemble import Assembler
from streams.core.assembly import Limits
from streams.core.effects import Envelope, Out, Source
from streams.core.judge import JudgeSpec
from streams.core.reward_join import RewardJoin, RewardOut, Scored
from streams.core.rewards import Rewarder, build_rewarder
from streams.core.select import Strategy, build_strategy
from streams.core.store import MemoryStore
from streams.envelope import Edge
from streams.errors import TrinityRejected, TrinityUnavailable
from streams.models import AvroModel, Tick, Trajectory
from streams.state_codec import ObjectState

CODEC = SchemaRegistry.default()
EDGE = Edge(CODEC)
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Core:
    """The assemble and reward stages wired as the live worker wires them, in memory."""

    strategy: Strategy = field(default_factory=lambda: build_strategy("sampling:1"))
    rewarder: Rewarder = field(default_factory=lambda: build_rewarder("streams.rewards:success"))
    limits: Limits = field(default_factory=lambda: Limits(abandon_after=timedelta(seconds=60)))
    late_retention: timedelta = timedelta(seconds=120)
    feedback_grace: timedelta = timedelta(0)
    score_incomplete: bool = False
    judge: JudgeSpec | None = None
    verdict_retention: timedelta = timedelta(hours=1)
    objects: bool = False
    """Keep the stages' state as objects (replay's :class:`ObjectState`), not as bytes."""

    def __post_init__(self) -> None:
        self.pending, self.closed, self.awaiting = MemoryStore(), MemoryStore(), MemoryStore()
        self.verdicts = MemoryStore()
        state = ObjectState(CODEC) if self.objects else None
        self.assembler = Assembler(
            self.strategy,
            limits=self.limits,
            late_retention=self.late_retention,
            pending=self.pending,
            closed=self.closed,
            codec=CODEC,
            state=state,
        )
        self.join = RewardJoin(
            self.rewarder,
            awaiting=self.awaiting,
            codec=CODEC,
            feedback_grace=self.feedback_grace,
            abandon_after=self.limits.abandon_after,
            score_incomplete=self.score_incomplete,
            judge=self.judge,
            verdicts=self.verdicts if self.judge is not None else None,
            verdict_retention=self.verdict_retention,
            state=state,
        )
        self.out = Out()
        self.scored: list[Scored] = []  # every scoring of the reward stage, in order
        self._offset = 0

    def source(self, topic: str, record: AvroModel, key: bytes | None = None) -> Envelope:
        """The record as read from ``topic``, opened at the edge as a runner does."""
        self._offset += 1
        call_id = getattr(record, "call_id", None)
        if key is None and call_id is not None:
            key = call_id.encode()
        return EDGE.read(Source(topic, 0, self._offset, key, CODEC.encode(record)))

    def event(self, record: AvroModel, now: datetime, key: bytes | None = None) -> Out:
        """An agent event read at ``now``; its trajectory, if any, goes on to the reward stage."""
        return self._through(
            self.assembler.on_record(self.source("agent-events", record, key), now), now
        )

    def feedback(self, record: AvroModel, now: datetime) -> Out:
        return self._record(self.join.on_record(self.source("user-feedback", record), now))

    def verdict(self, record: AvroModel, now: datetime) -> Out:
        """A record read from ``<p>.verdicts`` by the reward stage."""
        return self._record(self.join.on_record(self.source("verdicts", record), now))

    def trajectory(self, record: AvroModel, now: datetime) -> Out:
        """A trajectory (re)delivered to the reward stage."""
        return self._record(self.join.on_record(self.source("trajectories", record), now))

    def tick(self, now: datetime) -> Out:
        """A clock tick for partition 0, to both stages (as the live ticks topic does)."""
        out = self._through(self.assembler.on_tick(0, now), now)
        joined = self._record(self.join.on_tick(0, now))
        return Out(out.emits + joined.emits, out.rejects + joined.rejects, out.stats + joined.stats)

    def _through(self, out: Out, now: datetime) -> Out:
        self._record(out)
        for trajectory in [e.record for e in out.emits if e.topic == "trajectories"]:
            src = self.source("trajectories", trajectory)
            self._record(self.join.on_record(src, now))
        return out

    def _record(self, out: Out) -> Out:
        self.out.extend(out)
        if isinstance(out, RewardOut):
            self.scored.extend(out.scored)
        return out

    # what happened so far
    def topic(self, name: str) -> list[Any]:
        return self.out.records(name)  # type: ignore[arg-type]

    def rejects(self, stage: str | None = None) -> list[tuple[str, str]]:
        return [(r.stage, r.reason) for r in self.out.rejects if stage in (None, r.stage)]


def tick_record(at: datetime) -> Tick:
    return Tick(at=at, source="test")


class ScriptedTrinity:
    """A :class:`streams.core.commits.CommitPort` that answers from a script.

    ``metrics`` is a list of answers, one per ``/metrics`` call (a dict, or an exception to
    raise); ``commits`` likewise for ``/commit`` (default: success). ``calls`` records the order.
    """

    def __init__(
        self, metrics: list[dict[str, Any] | Exception], commits: list[Any] | None = None
    ) -> None:
        self._metrics = list(metrics)
        self._commits = list(commits or [])
        self.calls: list[str] = []

    async def metrics(self) -> dict[str, Any]:
        self.calls.append("metrics")
        answer = self._metrics.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def commit(self) -> dict[str, Any]:
        self.calls.append("commit")
        answer = self._commits.pop(0) if self._commits else {"status": "success"}
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)


def m(step: int, ready: int) -> dict[str, Any]:
    """A /metrics answer."""
    return {"explore_step_num": step, "rollout/ready_experience_count": ready}


DOWN = TrinityUnavailable("503 from /metrics")
REJECTED = TrinityRejected("400")

__all__ = [
    "CODEC",
    "DOWN",
    "REJECTED",
    "REPO_ROOT",
    "Core",
    "ScriptedTrinity",
    "Trajectory",
    "m",
    "tick_record",
]
