"""The assemble stage's batch (streams/runtime/live_close.py) and the store whose writes wait
for the end of a batch (streams/runtime/stores.py): what a batch writes, what it sends and in
which order, and what it leaves to the reward and feedback stages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import streams.runtime.live_close as live_close
import streams.runtime.live_guard as live_guard
from streams.codec import SchemaRegistry
from streams.core.store import MemoryStore
from streams.errors import TrinityRejected, TrinityUnavailable
from streams.models import (
    DeadLetter,
    FeedbackAck,
    RewardedTrajectory,
    SelectionDecision,
    Trajectory,
)
from streams.runtime.live import Pipeline
from streams.runtime.stores import BatchedStore, TableStore
from streams.settings import load_settings
from tests.unit.factories import at, end, start, step
from tests.unit.runtime.test_both_runners import Event, Sink

CODEC = SchemaRegistry.default()


class Recording(MemoryStore):
    """A store that records its writes, as a changelog would (a table writes no tombstone for a
    key it does not hold: :class:`TableStore`)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bytes]] = []

    def set(self, key: bytes, value: bytes) -> None:
        self.writes.append(("set", key))
        super().set(key, value)

    def delete(self, key: bytes) -> None:
        if self.get(key) is not None:
            self.writes.append(("delete", key))
        super().delete(key)


def test_a_batch_writes_only_what_it_leaves() -> None:
    inner = Recording()
    inner.set(b"old", b"1")
    inner.writes.clear()
    store = BatchedStore(inner)
    store.set(b"a", b"1")
    store.set(b"a", b"2")  # written twice: one write
    store.set(b"b", b"1")
    store.delete(b"b")  # written and deleted in the batch: no write at all
    store.delete(b"old")  # held before the batch: deleted
    store.delete(b"never")  # never held: nothing
    assert store.get(b"a") == b"2" and store.get(b"b") is None and store.get(b"old") is None
    assert sorted(store.items()) == [(b"a", b"2")]
    assert inner.writes == [] and len(store) == 4
    store.flush()
    assert sorted(inner.writes) == [("delete", b"old"), ("set", b"a")]
    assert dict(inner.items()) == {b"a": b"2"} and len(store) == 0
    store.set(b"c", b"1")
    store.discard()
    assert store.get(b"c") is None and dict(inner.items()) == {b"a": b"2"}


class FakeTable(dict):  # type: ignore[type-arg]
    """A Faust table's surface: writes go to the partition ``partition_for_key`` names."""

    def __init__(self) -> None:
        super().__init__()
        self.changelog: list[tuple[int | None, bytes, bytes | None]] = []

    def partition_for_key(self, key: Any) -> int | None:
        return None  # Faust: the current event's partition (there is none in a batch)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.changelog.append((self.partition_for_key(key), key, value))
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self.changelog.append((self.partition_for_key(key), key, None))
        super().__delitem__(key)


def test_each_write_goes_to_the_partition_of_the_record_that_made_it() -> None:
    table = FakeTable()
    store = BatchedStore(TableStore(table))
    store.partition = 3
    store.set(b"x", b"1")
    store.partition = 1
    store.set(b"y", b"1")
    store.flush()
    assert table.changelog == [(3, b"x", b"1"), (1, b"y", b"1")]
    table[b"z"] = b"1"  # outside a flush: Faust's own rule again
    assert table.changelog[-1] == (None, b"z", b"1")


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

    async def aclose(self) -> None:
        pass


def pipeline(trinity: Trinity, **reward: Any) -> tuple[Pipeline, list[Any], set[int]]:
    settings = load_settings(
        selection={"strategy": "sampling:1"}, observe={"port": 0}, reward=reward
    )
    p = Pipeline(settings, bootstrap="127.0.0.1:9", trinity=lambda: trinity)  # type: ignore[arg-type,return-value]
    p.batched = (BatchedStore(Recording()), BatchedStore(Recording()))
    p.assembler.pending, p.assembler.closed = p.batched
    p.reward_join.awaiting = MemoryStore()
    sent: list[Any] = []
    handled: set[int] = set()
    for name in ("trajectories", "rewarded", "decisions", "ledger", "dead", "late"):
        setattr(p, f"t_{name}", Sink(name, sent, handled))
    return p, sent, handled


def events(call_id: str, offset: int) -> list[Event]:
    records = [start(call_id), step(call_id, 0), end(call_id, step_count=1)]
    return [
        Event("trajstream.agent-events", offset + i, call_id.encode(), CODEC.encode(r))
        for i, r in enumerate(records)
    ]


def sent_records(sent: list[Any], handled: set[int]) -> list[tuple[str, type, bool]]:
    return [(n, type(CODEC.decode(v)), i in handled) for i, (n, _, v) in enumerate(sent)]


@pytest.fixture(autouse=True)
def _clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_guard, "wall_clock", lambda: at(5))


def test_a_call_closed_in_one_batch_is_fed_back_there_and_writes_no_open_call() -> None:
    trinity = Trinity()
    p, sent, handled = pipeline(trinity)
    asyncio.run(p._assemble(events("c1", 0)))
    assert trinity.acked == [["chatcmpl-c1-0"]]
    assert sorted(sent_records(sent, handled), key=str) == sorted(
        [
            ("trajectories", Trajectory, True),  # an output: the reward stage passes it over
            ("decisions", SelectionDecision, False),
            ("rewarded", RewardedTrajectory, True),  # an output: the feedback stage too
            ("ledger", FeedbackAck, False),
        ],
        key=str,
    )
    pending, closed = (store.inner for store in p.batched)
    assert pending.writes == []  # opened and closed in the batch: nothing to write
    assert [w for w, _ in closed.writes] == ["set"]  # the closed call's marker
    assert p.stats["feedback.direct"] == 1


def test_a_call_split_over_batches_writes_each_open_event_once() -> None:
    p, _, _ = pipeline(Trinity())
    first, second, third = events("c1", 0)
    asyncio.run(p._assemble([first, second]))
    pending = p.batched[0].inner
    assert [w for w, _ in pending.writes] == ["set", "set"]
    asyncio.run(p._assemble([third]))
    assert [w for w, _ in pending.writes] == ["set", "set", "delete", "delete"]
    assert dict(pending.items()) == {}


def test_a_feedback_trinity_did_not_take_goes_to_the_feedback_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trinity = Trinity(down=True)
    p, sent, handled = pipeline(trinity)
    asyncio.run(p._assemble(events("c1", 0)))
    kinds = sent_records(sent, handled)
    assert ("rewarded", RewardedTrajectory, False) in kinds  # a hop: stage 3 retries it
    assert ("trajectories", Trajectory, True) in kinds  # rewarded here all the same
    assert not [k for k in kinds if k[0] == "ledger"]  # not acknowledged: no ack for the ledger
    assert p.stats["feedback.deferred"] == 1 and trinity.tries == 1
    # for DIRECT_PAUSE_S the stage leaves every feedback to stage 3: Trinity is not asked
    trinity.down = False
    asyncio.run(p._assemble(events("c2", 10)))
    assert trinity.tries == 1 and trinity.acked == []
    assert sent_records(sent, handled)[-1] == ("rewarded", RewardedTrajectory, False)
    # after it, the stage feeds back itself again
    monkeypatch.setattr(live_close.time, "monotonic", lambda: 10**9)
    asyncio.run(p._assemble(events("c3", 20)))
    assert trinity.acked == [["chatcmpl-c3-0"]]


def test_a_feedback_trinity_rejected_is_a_dead_letter_at_once() -> None:
    trinity = Trinity(rejects=True)
    p, sent, handled = pipeline(trinity)
    asyncio.run(p._assemble(events("c1", 0)))
    kinds = sent_records(sent, handled)
    assert ("rewarded", RewardedTrajectory, True) in kinds  # not sent again by stage 3
    assert not [k for k in kinds if k[0] == "ledger"]
    (letter,) = [CODEC.decode(v) for n, _, v in sent if n == "dead"]
    assert letter.stage == "feedback" and letter.error_type == "RecordError"
    assert letter.reason == "Trinity rejected the feedback: 400 from Trinity: unknown msg_ids"
    assert letter.source_topic == p.topics.rewarded and letter.source_offset == -1
    assert isinstance(CODEC.decode(letter.payload), RewardedTrajectory)
    assert trinity.tries == 1 and p.stats["feedback.deferred"] == 0
    asyncio.run(p._assemble(events("c2", 10)))  # no pause after a rejection
    assert trinity.tries == 2


def test_a_trajectory_that_waits_goes_to_the_reward_stage() -> None:
    trinity = Trinity()
    p, sent, handled = pipeline(
        trinity, function="streams.rewards:user_rating", feedback_grace_s=30
    )
    asyncio.run(p._assemble(events("c1", 0)))
    assert ("trajectories", Trajectory, False) in sent_records(sent, handled)
    assert trinity.tries == 0 and not [n for n, _, _ in sent if n in ("rewarded", "ledger")]


def test_a_failed_batch_writes_nothing_and_forgets_what_its_stage_cached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, sent, _ = pipeline(Trinity())
    first, second, third = events("c1", 0)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the producer failed")

    monkeypatch.setattr(p, "_send", broken)
    with pytest.raises(RuntimeError):
        asyncio.run(p._assemble([first, second]))
    pending = p.batched[0]
    assert pending.inner.writes == [] and len(pending) == 0
    monkeypatch.undo()
    monkeypatch.setattr(live_guard, "wall_clock", lambda: at(5))
    # the batch is read again (not acknowledged): the call is assembled as if it never was
    asyncio.run(p._assemble([first, second, third]))
    letters = [CODEC.decode(v) for n, _, v in sent if n in ("dead", "late")]
    assert not [d for d in letters if isinstance(d, DeadLetter)]
    assert [n for n, _, _ in sent].count("trajectories") == 1


def test_the_tables_are_written_only_after_the_broker_took_the_batch() -> None:
    p, sent, _ = pipeline(Trinity())
    first, second, third = events("c1", 0)
    pending: list[asyncio.Future[None]] = []

    class Slow(Sink):
        async def send(self, *args: Any, **kwargs: Any) -> asyncio.Future[None]:
            await super().send(*args, **kwargs)
            delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            pending.append(delivery)
            return delivery

    for name in ("trajectories", "rewarded", "decisions", "ledger"):
        setattr(p, f"t_{name}", Slow(name, sent))

    async def main() -> None:
        await p._assemble([first])  # nothing sent: written at once
        closed, opened = p.batched[1].inner, p.batched[0].inner
        assert [w for w, _ in opened.writes] == ["set"]
        batch = asyncio.create_task(p._assemble([second, third]))
        for _ in range(20):  # the batch runs until it waits for its deliveries
            await asyncio.sleep(0)
        assert len(pending) == 4  # trajectory, decision, rewarded, acknowledgement
        assert not batch.done() and closed.writes == [] and len(opened.writes) == 1
        for delivery in pending:
            delivery.set_result(None)
        await batch
        assert [w for w, _ in closed.writes] == ["set"]
        assert [w for w, _ in opened.writes] == ["set", "delete"]

    asyncio.run(main())


class MemoryTable(dict):  # type: ignore[type-arg]
    """A Faust table over Faust's own in-memory store (``data``), written as Faust's table
    writes it; ``partition_for_key`` is the partition of the record being handled."""

    def __init__(self) -> None:
        import faust

        super().__init__()
        app = faust.App("t-own-keys", broker="kafka://127.0.0.1:9")
        self.data = app.Table("pending", partitions=4, key_type=bytes, value_type=bytes).data
        self.current = 0

    def partition_for_key(self, key: Any) -> int | None:
        return self.current

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def __delitem__(self, key: bytes) -> None:
        del self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data


async def test_keys_written_here_are_forgotten_when_their_partition_moves_away() -> None:
    from faust.types import TP

    table = MemoryTable()
    store = TableStore(table)
    for partition, key in ((0, b"a"), (1, b"b"), (2, b"c")):
        table.current = partition
        store.set(key, b"1")
    batched = BatchedStore(store)
    batched.partition = 3
    batched.set(b"d", b"1")
    batched.flush()
    table.data._key_partition[b"restored"] = 1  # as Faust's recovery records a key it read
    table.data[b"restored"] = b"1"
    store.delete(b"restored")  # deleted since: not remembered either
    assert table.data._key_partition == {b"a": 0, b"b": 1, b"c": 2, b"d": 3}
    # a rebalance leaves this worker partitions 1 and 3 of the table's changelog
    changelog = "t-own-keys-pending-changelog"
    await table.data.on_recovery_completed({TP(changelog, 1), TP(changelog, 3)}, set())
    assert dict(table.data.data) == {b"b": b"1", b"d": b"1"}


async def test_an_open_calls_entries_leave_with_its_key_without_a_record_of_their_own() -> None:
    from faust.types import TP

    from streams.state_codec import entry_key

    table = MemoryTable()
    store = TableStore(table, entries_follow_head=True)
    for partition, call in ((0, b"a"), (1, b"b")):
        table.current = partition
        for n in range(3):
            store.set(entry_key(call, n), b"1")
    # a restored call: Faust records each key its recovery read, entries too
    for n in range(2):
        table.data[entry_key(b"r", n)] = b"1"
        table.data._key_partition[entry_key(b"r", n)] = 0
    assert table.data._key_partition == {b"a": 0, b"b": 1, b"r": 0, entry_key(b"r", 1): 0}
    changelog = "t-own-keys-pending-changelog"
    await table.data.on_recovery_completed({TP(changelog, 1)}, set())
    assert sorted(table.data.data) == [b"b", entry_key(b"b", 1), entry_key(b"b", 2)]
    assert table.data._key_partition == {b"b": 1}
    # nothing dropped: nothing else touched
    await table.data.on_recovery_completed({TP(changelog, 1)}, set())
    assert len(table.data.data) == 3
