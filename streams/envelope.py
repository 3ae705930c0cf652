"""Records decoded at the edge: a Kafka record becomes an :class:`Envelope` before a stage sees it.

A runner reads a record (topic, partition, offset, key, bytes: a :class:`Source`) and opens it
with :meth:`Edge.open`: the bytes are decoded once (:mod:`streams.codec`) and the record's type
is checked against its topic, here and nowhere else (:data:`ACCEPTS`). The envelope carries where
the record came from and the decoded record, or why it could not be used (a
:class:`~streams.errors.RecordError`: a dead letter of whichever stage it was meant for, with
that reason and the original bytes as payload). Stages dispatch on the record's type and never
decode, nor look at topic names; replay hands them records it already holds (a trajectory the
assemble stage closed, a verdict it asked for) with :meth:`Envelope.handed`, not encoded again.

Which topic carries what (a topic's role is its name after the deployment's prefix, as in
:class:`streams.topics.Topics`):

=================  ====================================================================
topic              records
=================  ====================================================================
agent-events       AgentCall, Completion
user-feedback      UserFeedback
ticks              Tick (only ticks move the stages' clocks)
trajectories       Trajectory (no input topic can inject one)
verdicts           JudgeVerdict; a tombstone (the call's key, no value) is a
                   :class:`Tombstone`: judge that call again
spans              TraceFragment
ledger             FeedbackAck, Tick (the ledger clock), CommitResume, RoutingOverride
judge-requests     JudgeRequest
rewarded           RewardedTrajectory
replayed           FeedbackAck, CommitRecord, LedgerState
=================  ====================================================================

A record without a value (a tombstone) anywhere else is a dead letter, as is a record of a type
its topic does not carry.

May import: the standard library, :mod:`streams.codec`, :mod:`streams.models`,
:mod:`streams.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codec import SchemaRegistry
from .errors import DecodeError, RecordError
from .models import (
    AgentCall,
    AvroModel,
    CommitRecord,
    CommitResume,
    Completion,
    FeedbackAck,
    JudgeRequest,
    JudgeVerdict,
    LedgerState,
    RewardedTrajectory,
    RoutingOverride,
    Tick,
    TraceFragment,
    Trajectory,
    UserFeedback,
)

__all__ = ["ACCEPTS", "Edge", "Envelope", "Record", "Source", "Tombstone", "misplaced", "role_of"]


# Source and Envelope are plain (not frozen) dataclasses: one of each is made per record read,
# and a frozen dataclass's __init__ costs an object.__setattr__ per field. Treat them as values.
@dataclass(slots=True)
class Source:
    """One input record, as the runner read it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    """The record's bytes; ``b""`` for a record without a value (a tombstone): runners make
    a Source with :meth:`read`, which says so."""

    @classmethod
    def read(
        cls, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> Source:
        """A record as a Kafka client hands it over (a tombstone's value is ``None``)."""
        return cls(topic, partition, offset, key, b"" if value is None else value)

    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A record without a value where that means something: on ``verdicts``, the call's stored
    verdict is forgotten (it is judged again when asked)."""


Record = AvroModel | Tombstone


@dataclass(slots=True)
class Envelope:
    """A record for a stage: where it is (``partition``, ``offset``, ``key``), the decoded
    ``record`` or the ``problem`` that made it unusable, and the ``source`` as read (None for a
    record handed over in memory: it has no position on a topic and no bytes)."""

    partition: int
    offset: int
    key: bytes | None
    record: Record | None
    problem: RecordError | None = None
    source: Source | None = None

    @classmethod
    def handed(
        cls, record: Record, partition: int, key: bytes | None = None, offset: int = -1
    ) -> Envelope:
        """A record a runner holds already (replay's trajectories and verdicts, a backfill's
        acknowledgements): no bytes, no source."""
        return cls(partition, offset, key, record)

    def open(self) -> Record:
        """The record; its problem raised when it has none (the stage makes it a dead letter)."""
        if self.problem is not None:
            raise self.problem.with_traceback(None)
        assert self.record is not None
        return self.record

    @property
    def topic(self) -> str | None:
        return self.source.topic if self.source is not None else None

    @property
    def value(self) -> bytes:
        """The bytes as read (``b""`` when handed over in memory)."""
        return self.source.value if self.source is not None else b""

    def where(self) -> str:
        return self.source.where() if self.source is not None else f"[{self.partition}] (memory)"


ACCEPTS: dict[str, tuple[type[AvroModel], ...]] = {
    "agent-events": (AgentCall, Completion),
    "user-feedback": (UserFeedback,),
    "ticks": (Tick,),
    "trajectories": (Trajectory,),
    "verdicts": (JudgeVerdict,),
    "spans": (TraceFragment,),
    "ledger": (FeedbackAck, Tick, CommitResume, RoutingOverride),
    "judge-requests": (JudgeRequest,),
    "rewarded": (RewardedTrajectory,),
    "replayed": (FeedbackAck, CommitRecord, LedgerState),
}
"""The one table of which record types each topic carries (by role, see :func:`role_of`)."""

TOMBSTONES = frozenset({"verdicts"})
"""The topics on which a tombstone with a key means something (a :class:`Tombstone`)."""

_EXPECTED = frozenset({"judge-requests", "rewarded"})
# the pipeline's own single-type topics: a misplaced record reads "expected X, got Y" there, as
# it always has (the reasons of their dead letters are kept)


def role_of(topic: str) -> str:
    """A topic's role: its name after the deployment's prefix (``p.agent-events`` ->
    ``agent-events``; role names hold no dot)."""
    return topic.rpartition(".")[2]


def misplaced(record: Record, topic: str | None) -> RecordError:
    """The reason a record of this type is not taken from ``topic``."""
    name = "a tombstone" if isinstance(record, Tombstone) else record.avro_name
    return RecordError(f"{name} does not belong on {topic or 'this stage'}")


class Edge:
    """Opens Kafka records into envelopes: decodes once, checks the type against the topic."""

    def __init__(self, codec: SchemaRegistry | None = None) -> None:
        self.codec = codec or SchemaRegistry.default()

    def open(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> Envelope:
        """The envelope of a record as a Kafka client hands it over."""
        return self.read(Source.read(topic, partition, offset, key, value))

    def read(self, src: Source) -> Envelope:
        """The envelope of a record read as ``src``."""
        role = role_of(src.topic)
        if not src.value and src.key and role in TOMBSTONES:
            return Envelope(src.partition, src.offset, src.key, Tombstone(), source=src)
        try:
            record = self.codec.decode(src.value)
            accepted = ACCEPTS.get(role, ())
            if not isinstance(record, accepted):
                if role in _EXPECTED:
                    raise DecodeError(
                        f"expected {accepted[0].avro_name}, got {type(record).avro_name}"
                    )
                raise misplaced(record, src.topic)
        except RecordError as exc:
            return Envelope(src.partition, src.offset, src.key, None, exc, src)
        return Envelope(src.partition, src.offset, src.key, record, source=src)
