"""The stored form of open calls (streams.core.pending): one store entry per event, deleted at
close; the cache beside the store changes nothing the stage decides (a restart, an eviction or
the stored form of older versions give the same trajectories)."""

from __future__ import annotations

import io
import random
from typing import Any

import fastavro
import pytest

from streams.codec import MAGIC
from streams.core.pending import OpenCalls, entry_key, is_head_key
from streams.core.store import MemoryStore
from streams.models import AgentCall, Completion, PendingEvents, SelectionDecision, Trajectory
from tests.unit.core.harness import CODEC, EDGE, Core
from tests.unit.factories import at, end, start, step


class CountingStore(MemoryStore):
    """A MemoryStore that records the writes, as a table's changelog would carry them."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[bytes, int | None]] = []

    def set(self, key: bytes, value: bytes) -> None:
        self.writes.append((key, len(value)))
        super().set(key, value)

    def delete(self, key: bytes) -> None:
        if key in self.data:
            self.writes.append((key, None))
        super().delete(key)


def calls(rng: random.Random, n: int) -> list[AgentCall | Completion]:
    """``n`` calls of 0-6 steps, events shuffled within and between calls (START may come last),
    some redelivered."""
    events: list[AgentCall | Completion] = []
    for c in range(n):
        cid = f"call-{c}"
        k = rng.randint(0, 6)
        own: list[AgentCall | Completion] = [
            start(cid),
            *(step(cid, seq=s) for s in range(k)),
            end(cid, step_count=k),
        ]
        rng.shuffle(own)
        own += rng.sample(own, rng.randint(0, 2))  # redeliveries
        events += own
    rng.shuffle(events)
    return events


def run(
    events: list[Any], *, restart_every: int | None = None, objects: bool = False, **cache: int
) -> Core:
    core = Core(objects=objects)
    core.pending = CountingStore()
    core.assembler.pending = core.pending
    if cache:
        core.assembler.open = OpenCalls(
            core.pending, CODEC, state=core.assembler.stored, **cache
        )
    for i, event in enumerate(events):
        if restart_every and i % restart_every == 0:
            core.assembler.reset()  # what a restart or a rebalance leaves: the stores only
        core.event(event, at(i / 100))
    return core


def outcome(core: Core) -> tuple[list[Any], list[Any], list[Any]]:
    trajectories = sorted(
        (t.model_dump() for t in core.topic("trajectories") if isinstance(t, Trajectory)),
        key=lambda t: t["call_id"],
    )
    decisions = sorted(
        (d.call_id, d.closed_reason, d.steps)
        for d in core.topic("decisions")
        if isinstance(d, SelectionDecision)
    )
    return trajectories, decisions, sorted(core.rejects())


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    ("restart_every", "cache"),
    [(1, {}), (3, {}), (None, {"cache_calls": 1}), (None, {"cache_bytes": 1})],
    ids=["restart-every-event", "restart-every-3", "cache-of-one-call", "cache-of-one-byte"],
)
def test_the_cache_changes_nothing_decided(seed: int, restart_every: int | None, cache: Any):
    events = calls(random.Random(seed), 40)
    expected = outcome(run(events))
    assert len(expected[0]) == 40
    assert outcome(run(events, restart_every=restart_every, **cache)) == expected


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(
    ("restart_every", "cache"),
    [(None, {}), (3, {}), (None, {"cache_bytes": 1})],
    ids=["cached", "restart-every-3", "cache-of-one-byte"],
)
def test_state_kept_as_objects_decides_what_bytes_decide(
    seed: int, restart_every: int | None, cache: Any
) -> None:
    # replay keeps its stores' state as objects (ObjectState): the stage reads its entries back
    # from the store after a reset or an eviction as it reads bytes
    events = calls(random.Random(seed), 40)
    expected = outcome(run(events))
    got = run(events, restart_every=restart_every, objects=True, **cache)
    assert outcome(got) == expected
    assert all(isinstance(v, dict) for v in got.pending.data.values())
    assert all(not isinstance(v, bytes) for v in got.closed.data.values())


def test_each_event_is_one_write_of_about_its_size_and_closing_deletes_every_entry() -> None:
    events = [start(), *(step(seq=s) for s in range(100)), end(step_count=100)]
    core = run(events)
    writes = core.pending.writes
    sets = [(k, n) for k, n in writes if n is not None]
    # every event but the closing one is stored once, each under its own key
    assert [k for k, _ in sets] == [entry_key(b"call-1", i) for i in range(101)]
    for (_, n), event in zip(sets, events, strict=False):
        assert len(CODEC.encode(event)) < n < len(CODEC.encode(event)) + 64
    assert sorted(k for k, n in writes if n is None) == sorted(k for k, _ in sets)
    assert len(core.pending) == 0
    assert [d.closed_reason for d in core.topic("decisions")] == ["ended"]


def test_an_open_call_survives_a_restart_and_is_abandoned_on_the_clock() -> None:
    core = run([start(), step(seq=0), step(seq=1)])
    assert sorted(k for k in core.pending.data if is_head_key(k)) == [b"call-1"]
    core.assembler.reset()
    core.event(step(seq=1), at(2))  # a redelivery after the restart: still a duplicate
    assert core.assembler.open_calls() == ["call-1"]
    core.tick(at(61))
    (trajectory,) = core.topic("trajectories")
    assert [s.seq for s in trajectory.steps] == [0, 1]
    assert trajectory.closed_reason == "abandoned: no end event"
    assert len(core.pending) == 0


def test_a_call_stored_as_older_versions_did_is_read_and_completed() -> None:
    core = Core()
    first = [start(), step(seq=0)]
    record = PendingEvents(call_id="call-1", partition=0, first_seen=at(0)).to_avro()
    for event in first:
        data = CODEC.encode(event)
        kind, seq = (0, -1) if isinstance(event, AgentCall) else (2, event.seq)
        record["events"].append(
            {
                "event_id": event.event_id,
                "kind": kind,
                "seq": seq,
                "step_count": -1,
                "size": len(data),
                "data": data,
            }
        )
    buf = io.BytesIO()
    buf.write(MAGIC + CODEC.fingerprint_of(PendingEvents))
    fastavro.schemaless_writer(buf, CODEC.schema_of(PendingEvents), record)
    core.pending.set(b"call-1", buf.getvalue())
    core.event(step(seq=0), at(1))  # applied already: a duplicate
    core.event(step(seq=1), at(1))
    core.event(end(step_count=2), at(2))
    (trajectory,) = core.topic("trajectories")
    assert trajectory.input_messages == first[0].input_messages
    assert [s.seq for s in trajectory.steps] == [0, 1]
    assert trajectory.closed_reason == "ended"
    assert len(core.pending) == 0


def test_an_event_whose_step_failed_is_applied_when_redelivered() -> None:
    """A step that raises (here the strategy, a plugin) leaves the store as it was, and the
    cache too: the redelivered event is applied, not taken for a duplicate."""
    core = Core()
    failures = [RuntimeError("plugin failed")]

    class Flaky:
        def __init__(self, strategy: Any) -> None:
            self.strategy = strategy

        def decide(self, view: Any) -> Any:
            if failures:
                raise failures.pop()
            return self.strategy.decide(view)

    core.assembler.strategy = Flaky(core.assembler.strategy)
    core.event(start(), at(0))
    with pytest.raises(RuntimeError):
        core.event(end(step_count=0), at(1))
    core.event(end(step_count=0), at(2))  # redelivered
    assert [d.closed_reason for d in core.topic("decisions")] == ["ended"]
    assert len(core.pending) == 0


def test_after_a_reset_one_pass_over_the_store_rebuilds_every_partitions_deadlines() -> None:

    core = Core()
    for offset, (partition, call_id) in enumerate(((0, "call-a"), (1, "call-b"), (1, "call-c"))):
        src = EDGE.open(
            "agent-events", partition, offset, call_id.encode(), CODEC.encode(start(call_id))
        )
        core.assembler.on_record(src, at(0))
    core.assembler.reset()
    scans = 0
    items = core.assembler.pending.items

    def counted() -> Any:
        nonlocal scans
        scans += 1
        return items()

    core.assembler.pending.items = counted  # type: ignore[method-assign]
    abandoned = core.assembler.on_tick(0, at(61))
    assert [d.call_id for d in abandoned.records("decisions")] == ["call-a"]
    abandoned = core.assembler.on_tick(1, at(61))
    assert sorted(d.call_id for d in abandoned.records("decisions")) == ["call-b", "call-c"]
    assert scans == 1


class ReadCountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, key: bytes) -> bytes | None:
        self.reads += 1
        return super().get(key)


def test_past_the_bytes_bound_a_call_drops_its_decoded_events_and_keeps_its_progress() -> None:
    from streams.core.assembly import Progress

    store = ReadCountingStore()
    cache = OpenCalls(store, CODEC, cache_bytes=1)
    calls = {}
    for cid in ("a", "b"):
        event = start(cid)
        data = CODEC.encode(event)
        progress = Progress(cid, at(0), 0)
        progress.apply(event, len(data))
        calls[cid] = cache.add(cid.encode(), None, progress, event, data)
    # the bound holds the most recent call's events only; the older call keeps its progress
    assert calls["a"].events is None
    assert calls["b"].events is not None
    reads = store.reads
    again = cache.get(b"a")
    assert again is calls["a"] and again.progress.has_start
    assert store.reads == reads  # from the cache, not read back from the store
    # at close, the dropped events are decoded from the store
    state = cache.pending_call(b"a", again)
    assert state.start == start("a")
    assert store.reads > reads
