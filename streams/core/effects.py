"""What the core's stages return instead of doing I/O: records to emit and rejects.

A stage step takes an :class:`~streams.envelope.Envelope` (one input record, decoded at the
edge, with its :class:`Source`: topic, partition, offset, key, bytes) and ``now``, and returns
an :class:`Out`: records per output topic (named by the
attribute of :class:`streams.topics.Topics`, e.g. ``"trajectories"``), and :class:`Reject`\\ s,
each a dead letter or a late event with its reason. The live runner sends them to Kafka; replay
counts and reports them, with the same reasons.

May import: the standard library, :mod:`streams.envelope`, :mod:`streams.models` and
:mod:`streams.errors`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..envelope import Envelope, Source
from ..models import AvroModel, DeadLetter

__all__ = ["Emit", "Envelope", "Out", "Reject", "Source", "dead_letter"]

OutputTopic = Literal[
    "trajectories",
    "rewarded",
    "decisions",
    "ledger",
    "windows",
    "alerts",
    "commits",
    "judge_requests",
    "verdicts",
    "comparisons",
    "routing",
]


@dataclass(slots=True)
class Emit:
    """A record for an output topic (``topic`` names a :class:`~streams.topics.Topics` field)."""

    topic: OutputTopic
    key: bytes
    record: AvroModel
    partition: int | None = None


@dataclass(slots=True)
class Reject:
    """A record the stage could not use: a dead letter (``stage`` is the stage's name) or a late
    event (``stage == "late"``). ``source`` is the input record; without one (a decision taken
    on a clock tick) ``key`` and ``payload`` say what it was about."""

    stage: str
    reason: str
    error_type: str
    source: Source | None = None
    key: bytes | None = None
    payload: bytes | None = None

    @classmethod
    def of(cls, stage: str, exc: Exception, source: Source | None) -> Reject:
        """The dead letter of ``stage`` for an error raised on a record read as ``source``."""
        return cls(stage, str(exc) or type(exc).__name__, type(exc).__name__, source)

    @property
    def late(self) -> bool:
        return self.stage == "late"


class Stats(Counter[str]):
    """A stage's counts: a Counter made without Counter's own ``__init__`` (one per step,
    most of them empty)."""

    def __init__(self, iterable: Any = None, /, **counts: int) -> None:
        if iterable is not None or counts:
            super().__init__(iterable, **counts)


@dataclass(slots=True)
class Out:
    """Everything one step decided."""

    emits: list[Emit] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Stats)

    def emit(self, topic: OutputTopic, key: bytes, record: AvroModel, **kw: object) -> None:
        self.emits.append(Emit(topic, key, record, **kw))  # type: ignore[arg-type]

    def reject(self, reject: Reject) -> None:
        self.rejects.append(reject)

    def extend(self, other: Out) -> Out:
        self.emits.extend(other.emits)
        self.rejects.extend(other.rejects)
        self.stats.update(other.stats)
        return self

    def records(self, topic: OutputTopic) -> list[AvroModel]:
        return [e.record for e in self.emits if e.topic == topic]


def dead_letter(
    reject: Reject,
    now: datetime,
    worker: str,
    default_topic: str,
    max_payload: int | None = None,
) -> DeadLetter:
    """The :class:`~streams.models.DeadLetter` record of a reject (live dead letters, late
    events, and replay's report all use this). A payload over ``max_payload`` bytes is cut to
    that size, so that the dead letter fits in a record; the reason says so, and the source
    topic, partition and offset still name the whole record."""
    src = reject.source
    payload = reject.payload if reject.payload is not None else (src.value if src else None)
    if payload is None:  # a tombstone (a record without a value), however it got here
        payload = b""
    reason = reject.reason
    if max_payload is not None and len(payload) > max_payload:
        reason += f" (payload cut to {max_payload} of its {len(payload)} bytes)"
        payload = payload[:max_payload]
    return DeadLetter(
        reason=reason,
        error_type=reject.error_type,
        stage=reject.stage,
        source_topic=src.topic if src else default_topic,
        source_partition=src.partition if src else -1,
        source_offset=src.offset if src else -1,
        key=src.key if src else reject.key,
        payload=payload,
        failed_at=now,
        worker=worker,
    )
