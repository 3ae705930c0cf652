"""The edge: each topic carries only its own record types, checked where a record is opened
(:class:`streams.envelope.Edge`), once; a tombstone is a dead letter except where it means
something (on verdicts, with a key); what cannot be used keeps its bytes and says why."""

from __future__ import annotations

import pytest

from streams.codec import SchemaRegistry
from streams.envelope import ACCEPTS, Edge, Envelope, Tombstone, role_of
from streams.errors import DecodeError, RecordError
from streams.models import (
    AvroModel,
    FeedbackAck,
    JudgeVerdict,
    Tick,
    Trajectory,
    UserFeedback,
)
from tests.unit.factories import T0, ack, feedback, start, step, trajectory

CODEC = SchemaRegistry.default()
EDGE = Edge(CODEC)


def _verdict() -> JudgeVerdict:
    return JudgeVerdict(
        call_id="c1",
        trajectory_id="c1",
        score=0.5,
        judge_model="j",
        prompt_hash="h",
        requested_at=T0,
        judged_at=T0,
    )


SAMPLES: list[AvroModel] = [
    start("c1"),
    step("c1", 0),
    feedback("c1"),
    Tick(at=T0),
    trajectory(),
    ack("t1"),
]


def _open(topic: str, record: AvroModel, key: bytes | None = b"c1") -> Envelope:
    return EDGE.open(f"p.{topic}", 3, 7, key, CODEC.encode(record))


@pytest.mark.parametrize("topic", sorted(ACCEPTS))
@pytest.mark.parametrize("record", [*SAMPLES, _verdict()], ids=lambda r: type(r).__name__)
def test_each_topic_takes_only_its_own_record_types(topic: str, record: AvroModel) -> None:
    env = _open(topic, record)
    assert (env.partition, env.offset, env.key, env.topic) == (3, 7, b"c1", f"p.{topic}")
    if isinstance(record, ACCEPTS[topic]):
        assert env.problem is None and env.open() == record
    else:
        assert env.record is None and isinstance(env.problem, RecordError)
        with pytest.raises(RecordError):
            env.open()
        assert env.value == CODEC.encode(record)  # the dead letter's payload: the bytes read


def test_the_reasons_of_misplaced_records_are_those_of_earlier_versions() -> None:
    env = _open("user-feedback", Tick(at=T0))
    assert str(env.problem) == "io.trajstream.Tick does not belong on p.user-feedback"
    assert type(env.problem) is RecordError
    env = _open("rewarded", feedback("c1"))  # the pipeline's own single-type topics
    assert str(env.problem) == (
        "expected io.trajstream.RewardedTrajectory, got io.trajstream.UserFeedback"
    )
    assert type(env.problem) is DecodeError


@pytest.mark.parametrize("key", [b"c1", None])
@pytest.mark.parametrize("topic", sorted(ACCEPTS))
def test_a_tombstone_means_something_only_on_verdicts_with_a_key(
    topic: str, key: bytes | None
) -> None:
    env = EDGE.open(f"p.{topic}", 0, 1, key, None)
    if topic == "verdicts" and key is not None:
        assert isinstance(env.open(), Tombstone)
    else:
        assert "tombstone" in str(env.problem) and env.value == b""


def test_garbage_is_a_decode_error_with_its_bytes() -> None:
    env = EDGE.open("p.agent-events", 0, 1, b"k", b"\x00garbage")
    assert isinstance(env.problem, DecodeError) and env.value == b"\x00garbage"


def test_a_record_handed_over_in_memory_has_no_source() -> None:
    t = trajectory()
    env = Envelope.handed(t, 2, b"c1")
    assert env.open() is t and env.source is None and env.topic is None and env.value == b""


def test_a_topic_role_is_its_name_after_the_prefix() -> None:
    assert role_of("my.prefix.agent-events") == "agent-events"
    assert role_of("ticks") == "ticks"
    assert all(isinstance(t, tuple) for t in ACCEPTS.values())
    assert UserFeedback in ACCEPTS["user-feedback"] and Trajectory in ACCEPTS["trajectories"]
    assert FeedbackAck in ACCEPTS["ledger"]
