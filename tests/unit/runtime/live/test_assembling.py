"""The assemble stage's batch (streams/runtime/live/assembling.py) over memory: what a batch
writes, what it sends, and what it leaves to the reward and feedback stages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.errors import TrinityRejected, TrinityUnavailable
from streams.models import (
    DeadLetter,
    FeedbackAck,
    RewardedTrajectory,
    SelectionDecision,
    Trajectory,
)
from streams.runtime.live.feedback import DIRECT_PAUSE_S
from streams.settings import load_settings
from tests.unit.factories import at, end, start, step

from .memory import CODEC, Event, Recording, Worker, stages


class Trinity:
    """Trinity's /feedback: unavailable while ``down``, rejecting while ``rejects``; records
    what it acknowledged."""

    def __init__(self, down: bool = False, rejects: bool = False) -> None:
        self.down, self.rejects = down, rejects
        self.acked: list[list[str]] = []
        self.tries = 0

    async def feedback(self, msg_ids: list[str], reward: float, *args: Any) -> dict[str, Any]:
        self.tries += 1
        if self.down:
            raise TrinityUnavailable("503 from Trinity", status=503)
        if self.rejects:
            raise TrinityRejected("400 from Trinity: unknown msg_ids", status=400)
        self.acked.append(list(msg_ids))
        return {"status": "success"}


def worker(trinity: Trinity, hold_deliveries: bool = False, **reward: Any) -> Worker:
    settings = load_settings(selection={"strategy": "sampling:1"}, reward=reward)
    w = stages(
        settings,
        trinity=trinity,
        stores={"pending": Recording(), "closed": Recording()},
        hold_deliveries=hold_deliveries,
    )
    w.clock.now = at(5)
    return w


def events(call_id: str, offset: int) -> list[Event]:
    records = [start(call_id), step(call_id, 0), end(call_id, step_count=1)]
    return [
        Event("trajstream.agent-events", offset + i, call_id.encode(), CODEC.encode(r))
        for i, r in enumerate(records)
    ]


def sent_records(w: Worker) -> list[tuple[str, type, bool]]:
    return [(s.topic, type(s.record), s.handled) for s in w.sent]


def test_a_call_closed_in_one_batch_is_fed_back_there_and_writes_no_open_call() -> None:
    trinity = Trinity()
    w = worker(trinity)
    asyncio.run(w.stages.assemble.run(events("c1", 0)))
    assert trinity.acked == [["chatcmpl-c1-0"]]
    assert sorted(sent_records(w), key=str) == sorted(
        [
            ("trajectories", Trajectory, True),  # an output: the reward stage passes it over
            ("decisions", SelectionDecision, False),
            ("rewarded", RewardedTrajectory, True),  # an output: the feedback stage too
            ("ledger", FeedbackAck, False),
        ],
        key=str,
    )
    assert [s.partition for s in w.sent if s.topic == "ledger"] == [0]  # one partition
    assert w.stores["pending"].writes == []  # opened and closed in the batch: nothing written
    assert [op for op, _ in w.stores["closed"].writes] == ["set"]  # the closed call's marker
    assert w.stats["feedback.direct"] == 1


def test_a_call_split_over_batches_writes_each_open_event_once() -> None:
    w = worker(Trinity())
    first, second, third = events("c1", 0)
    asyncio.run(w.stages.assemble.run([first, second]))
    pending = w.stores["pending"]
    assert [op for op, _ in pending.writes] == ["set", "set"]
    asyncio.run(w.stages.assemble.run([third]))
    assert [op for op, _ in pending.writes] == ["set", "set", "delete", "delete"]
    assert dict(pending.items()) == {}


def test_a_feedback_trinity_did_not_take_goes_to_the_feedback_stage() -> None:
    trinity = Trinity(down=True)
    w = worker(trinity)
    asyncio.run(w.stages.assemble.run(events("c1", 0)))
    kinds = sent_records(w)
    assert ("rewarded", RewardedTrajectory, False) in kinds  # a hop: stage 3 retries it
    assert ("trajectories", Trajectory, True) in kinds  # rewarded here all the same
    assert not [k for k in kinds if k[0] == "ledger"]  # not acknowledged: no ack for the ledger
    assert w.stats["feedback.deferred"] == 1 and trinity.tries == 1
    # for DIRECT_PAUSE_S the stage leaves every feedback to stage 3: Trinity is not asked
    trinity.down = False
    w.monotonic.now += DIRECT_PAUSE_S - 1
    asyncio.run(w.stages.assemble.run(events("c2", 10)))
    assert trinity.tries == 1 and trinity.acked == []
    assert sent_records(w)[-1] == ("rewarded", RewardedTrajectory, False)
    # after it, the stage feeds back itself again
    w.monotonic.now += 1
    asyncio.run(w.stages.assemble.run(events("c3", 20)))
    assert trinity.acked == [["chatcmpl-c3-0"]]


def test_a_feedback_trinity_rejected_is_a_dead_letter_at_once() -> None:
    trinity = Trinity(rejects=True)
    w = worker(trinity)
    asyncio.run(w.stages.assemble.run(events("c1", 0)))
    kinds = sent_records(w)
    assert ("rewarded", RewardedTrajectory, True) in kinds  # not sent again by stage 3
    assert not [k for k in kinds if k[0] == "ledger"]
    (letter,) = w.records("dead_letters")
    assert letter.stage == "feedback" and letter.error_type == "RecordError"
    assert letter.reason == "Trinity rejected the feedback: 400 from Trinity: unknown msg_ids"
    assert letter.source_topic == "trajstream.rewarded" and letter.source_offset == -1
    assert isinstance(CODEC.decode(letter.payload), RewardedTrajectory)
    assert trinity.tries == 1 and w.stats["feedback.deferred"] == 0
    asyncio.run(w.stages.assemble.run(events("c2", 10)))  # no pause after a rejection
    assert trinity.tries == 2


def test_a_trajectory_that_waits_goes_to_the_reward_stage() -> None:
    trinity = Trinity()
    w = worker(trinity, function="streams.rewards:user_rating", feedback_grace_s=30)
    asyncio.run(w.stages.assemble.run(events("c1", 0)))
    assert ("trajectories", Trajectory, False) in sent_records(w)
    assert trinity.tries == 0 and not [s for s in w.sent if s.topic in ("rewarded", "ledger")]


def test_a_failed_batch_writes_nothing_and_forgets_what_its_stage_cached() -> None:
    w = worker(Trinity())
    first, second, third = events("c1", 0)
    junk = Event("trajstream.agent-events", 9, b"c1", b"not avro")  # a dead letter to send
    sink = w.stages.sink
    topics = sink.topics

    class Broken:
        async def send(self, **kwargs: Any) -> Any:
            raise RuntimeError("the producer failed")

    sink.topics = {name: Broken() for name in topics}
    with pytest.raises(RuntimeError):
        asyncio.run(w.stages.assemble.run([first, second, junk]))
    assert w.stores["pending"].writes == []
    assert all(len(store) == 0 for store in w.stages.checkpoint.stores)
    sink.topics = topics
    # the batch is read again (not acknowledged): the call is assembled as if it never was
    asyncio.run(w.stages.assemble.run([first, second, third]))
    letters = w.records("dead_letters") + w.records("late_events")
    assert not [d for d in letters if isinstance(d, DeadLetter)]
    assert [s.topic for s in w.sent].count("trajectories") == 1


def test_the_tables_are_written_only_after_the_broker_took_the_batch() -> None:
    w = worker(Trinity(), hold_deliveries=True)
    first, second, third = events("c1", 0)
    held = w.held
    assert held is not None
    opened, closed = w.stores["pending"], w.stores["closed"]

    async def main() -> None:
        await w.stages.assemble.run([first])  # nothing sent: written at once
        assert [op for op, _ in opened.writes] == ["set"]
        batch = asyncio.create_task(w.stages.assemble.run([second, third]))
        for _ in range(20):  # the batch runs until it waits for its deliveries
            await asyncio.sleep(0)
        assert len(held) == 4  # trajectory, decision, rewarded, acknowledgement
        assert not batch.done() and closed.writes == [] and len(opened.writes) == 1
        for delivery in held:
            delivery.set_result(None)
        await batch
        assert [op for op, _ in closed.writes] == ["set"]
        assert [op for op, _ in opened.writes] == ["set", "delete"]

    asyncio.run(main())
