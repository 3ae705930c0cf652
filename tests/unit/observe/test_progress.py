"""The progress watch: input partitions with records waiting whose committed offset stands
still (a consumer stuck after a rebalance), on a fake clock."""

from __future__ import annotations

from streams.observe.progress import ProgressWatch

EV = ("p.agent-events", 0)
EV1 = ("p.agent-events", 1)


def watch(stall_s: float = 120.0) -> tuple[ProgressWatch, list[float]]:
    now = [1000.0]
    return ProgressWatch(stall_s, clock=lambda: now[0]), now


def test_records_waiting_at_an_offset_that_does_not_move_stall_after_the_limit():
    w, now = watch()
    w.sample({EV: (50, 10)})
    now[0] += 119
    w.sample({EV: (60, 10)})  # more arrive; the committed offset stands
    assert w.stuck() == {EV: 119.0}
    assert w.stalled() == {} and w.describe() == ""
    now[0] += 1
    assert w.stalled() == {EV: 120.0}
    assert w.describe() == "p.agent-events[0]: 50 records waiting at offset 10, not moved for 120 s"


def test_a_committed_offset_that_moves_starts_the_count_again():
    w, now = watch()
    w.sample({EV: (50, 10)})
    now[0] += 100
    w.sample({EV: (50, 11)})  # one record committed: it is moving
    now[0] += 100
    assert w.stuck() == {EV: 100.0} and w.stalled() == {}
    now[0] += 20
    assert w.stalled() == {EV: 120.0}


def test_nothing_waiting_is_never_stuck_whatever_the_time():
    w, now = watch()
    w.sample({EV: (10, 10), EV1: (0, None)})  # caught up; an empty partition never committed
    now[0] += 10_000
    w.sample({EV: (10, 10), EV1: (0, None)})
    assert w.stuck() == {} and w.stalled() == {}


def test_a_partition_never_committed_counts_from_offset_zero():
    w, now = watch()
    w.sample({EV: (5, None)})
    now[0] += 130
    w.sample({EV: (5, None)})
    assert w.describe() == "p.agent-events[0]: 5 records waiting at offset 0, not moved for 130 s"


def test_an_unknown_end_or_a_partition_left_out_is_forgotten():
    w, now = watch()
    w.sample({EV: (50, 10), EV1: (50, 10)})
    now[0] += 200
    assert set(w.stalled()) == {EV, EV1}
    w.sample({EV: (None, 10)})  # EV: end not known; EV1: no longer assigned
    assert w.stuck() == {}
    w.sample({EV: (50, 10)})  # known again: counted from now, not from before
    now[0] += 60
    assert w.stuck() == {EV: 60.0}


def test_caught_up_in_between_starts_afresh():
    w, now = watch()
    w.sample({EV: (50, 10)})
    now[0] += 100
    w.sample({EV: (10, 10)})  # the end read back as the committed offset: nothing waits
    w.sample({EV: (11, 10)})  # a new record at the same committed offset
    now[0] += 100
    assert w.stuck() == {EV: 100.0}


def test_reset_forgets_every_partition():
    w, now = watch()
    w.sample({EV: (50, 10)})
    now[0] += 500
    w.reset()
    assert w.stalled() == {} and w.describe() == ""
