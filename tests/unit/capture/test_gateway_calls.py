"""The gateway's call table entries (streams.capture.gateway.calls.CallState): the step seqs a
call recorded, and what shadow mode has on its way, kept so that a table of many open calls
costs the serving process's garbage collector one object per call."""

from __future__ import annotations

import asyncio
import gc

import pytest

from streams.capture.gateway import CallState, CallTable
from streams.capture.routing import Route
from streams.models import Selection

ROUTE = Route(Selection(selected=True, strategy="sampling:1", reason="sampled"), "route")


def test_seqs_are_recorded_once_each_and_counted() -> None:
    state = CallState(ROUTE)
    assert not state.has(0) and state.steps == 0
    for seq in (3, 0, 3, 200):
        state.add(seq)
    assert [s for s in range(300) if state.has(s)] == [0, 3, 200]
    assert state.steps == 3
    assert not state.has(-1)
    with pytest.raises(ValueError, match="seq"):
        state.add(-1)


def test_a_route_mode_call_is_one_object_for_the_garbage_collector() -> None:
    """What a full collection scans per open call: the entry only (its route is shared)."""
    table = CallTable(limit=1000)
    for n in range(1000):
        state = table.add(f"call-{n}", CallState(ROUTE))
        state.add(1)
        state.add(2)
    for n in range(1000):
        state = table.get(f"call-{n}")
        assert state is not None
        tracked = [o for o in gc.get_referents(state) if gc.is_tracked(o) and o is not CallState]
        assert tracked == [ROUTE], tracked


async def test_shadow_answers_are_taken_once_and_cancelled_at_the_end() -> None:
    state = CallState(ROUTE)
    assert state.take_shadow(1) is None
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    state.await_shadow(1, first)
    state.await_shadow(2, second)
    assert state.take_shadow(1) is first and state.take_shadow(1) is None
    state.cancel_shadows()
    assert second.cancelled() and not first.cancelled()


async def test_a_watched_step_is_pending_until_it_is_done() -> None:
    state = CallState(ROUTE)
    assert not state.pending
    release = asyncio.Event()
    task = asyncio.create_task(release.wait())
    state.watch(task)
    assert state.pending == {task}
    release.set()
    await task
    await asyncio.sleep(0)  # the done callbacks run
    assert not state.pending
