"""The worker process's limits: repeated Kafka client messages held back, a stop that ends."""

from __future__ import annotations

import asyncio
import logging
import signal

import pytest

from streams.runtime.live import worker
from streams.runtime.live.worker import Repeats, install_log_limits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = "aiokafka.client") -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)


@pytest.mark.parametrize(
    ("messages", "passed"),
    [
        # the same message with other arguments is the same message
        ([("Unable connect to node with id %s", (1,))] * 10, 3),
        # distinct messages each get their burst
        ([("a %s", (1,))] * 5 + [("b %s", (1,))] * 5, 6),
        ([("once", ())], 1),
    ],
)
def test_each_message_passes_a_few_times_a_period(messages, passed) -> None:
    f = Repeats(burst=3, period=60, clock=Clock())
    assert sum(f.filter(_record(m, *a)) for m, a in messages) == passed


def test_one_summary_a_period_says_how_many_were_held_back(caplog) -> None:
    clock = Clock()
    f = Repeats(burst=2, period=60, clock=clock)
    for _ in range(1000):
        f.filter(_record("Unable connect to node with id %s", 1))
    assert f.held == 998
    clock.now = 61
    with caplog.at_level(logging.WARNING, logger="trajstream"):
        assert f.filter(_record("Unable connect to node with id %s", 1))  # a new period
    [summary] = [r.getMessage() for r in caplog.records if r.name == "trajstream"]
    assert "998 repeated messages held back in the last 60s" in summary
    assert "Unable connect to node with id 1" in summary
    assert f.held == 0


def test_every_aiokafka_logger_is_limited() -> None:
    f = install_log_limits()
    for name in ("aiokafka", "aiokafka.conn", "aiokafka.consumer.fetcher"):
        assert f in logging.getLogger(name).filters
    assert install_log_limits() is f  # a second install adds nothing twice
    assert logging.getLogger("aiokafka.conn").filters.count(f) == 1


def test_the_worker_has_no_spinner_that_would_put_the_root_logger_at_debug() -> None:
    import faust

    from streams.runtime.live.worker import BoundedWorker

    app = faust.App("t-spinner", broker="kafka://127.0.0.1:9")
    w = BoundedWorker(app, loglevel="warn", quiet=True, stop_timeout_s=3)
    assert w.spinner is None
    assert w.stop_timeout_s == 3
    root = logging.getLogger()
    level = root.level
    w._setup_spinner_handler(root, logging.WARNING)
    assert root.level == level, "no handler put the root logger at DEBUG"


_FRAGMENTED_HEAP = """
import json, sys
from streams.runtime.live.worker import install_allocator_limits, trim_heap

def rss():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) * 1024

print("installed", install_allocator_limits(), file=sys.stderr)
# 64 MiB of 64 KiB buffers (below the mmap threshold: carved from the heap), each followed by
# a small value that stays: freed, the buffers are holes the heap's top cannot give back
buffers, kept = [], []
for i in range(1024):
    buffers.append(bytearray(64 * 1024))
    kept.append(bytes(1000 + (i & 7)))
del buffers
freed = rss()
%s
print(json.dumps({"freed": freed, "after": rss()}))
"""


def _heap_after(trim: bool) -> dict[str, int]:
    import json
    import subprocess
    import sys

    code = _FRAGMENTED_HEAP.replace("%s", "trim_heap()" if trim else "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(worker._libc() is None, reason="glibc's malloc only")
def test_a_heap_trim_gives_back_what_freed_buffers_left_inside_the_heap() -> None:
    untrimmed = _heap_after(trim=False)
    trimmed = _heap_after(trim=True)
    # without the trim, the freed 64 MiB stay the process's; with it, most go back
    assert untrimmed["freed"] - untrimmed["after"] < 8 << 20
    assert trimmed["freed"] - trimmed["after"] > 48 << 20


def test_the_worker_trims_its_heap_on_a_timer() -> None:
    assert "heap_trimmer" in worker.BoundedWorker._tasks[worker.BoundedWorker._get_class_id()]


async def test_once_started_the_worker_moves_the_start_out_of_collections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import faust

    froze: list[bool] = []
    monkeypatch.setattr(worker, "keep_out_of_collections", lambda: froze.append(True))
    app = faust.App("t-freeze", broker="kafka://127.0.0.1:9")
    w = worker.BoundedWorker(app, loglevel="warn", quiet=True, stop_timeout_s=3)
    await w.on_startup_finished()
    assert froze == [True]


class _Clock:
    """A clock that the fake sleep moves."""

    def __init__(self) -> None:
        self.now = 0.0

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


async def test_a_stall_that_lasts_stops_the_worker_with_its_reason() -> None:
    clock = _Clock()
    answers = iter([None, "stuck A", "stuck A", None, "stuck B", "stuck B", "stuck B", "stuck C"])
    stopped: list[tuple[float, str]] = []
    await asyncio.wait_for(
        worker.exit_on_stall(
            lambda: next(answers),
            10,
            lambda reason: stopped.append((clock.now, reason)),
            every_s=5,
            clock=clock,
            sleep=clock.sleep,
        ),
        5,
    )
    # A lasted 5 s and cleared: counted afresh; B was seen at 25, 30, 35: 10 s at 35
    assert stopped == [(35.0, "stuck B")]


async def test_no_stall_no_stop() -> None:
    clock = _Clock()
    asks: list[float] = []

    def reason() -> None:
        asks.append(clock.now)
        if len(asks) == 50:
            raise asyncio.CancelledError  # the worker's stop cancels the task
        return None

    with pytest.raises(asyncio.CancelledError):
        await worker.exit_on_stall(
            reason, 10, lambda r: pytest.fail(r), every_s=5, clock=clock, sleep=clock.sleep
        )
    assert asks[-1] == 250.0


def test_a_worker_stopped_for_a_stall_exits_with_its_own_status(monkeypatch) -> None:
    import faust

    app = faust.App("t-stall-exit", broker="kafka://127.0.0.1:9")
    w = worker.BoundedWorker(app, loglevel="warn", quiet=True, stop_timeout_s=3)
    scheduled: list[object] = []
    monkeypatch.setattr(w, "_schedule_shutdown", scheduled.append)

    def stopped_by_mode() -> None:  # mode's worker exits 0 after any stop
        raise SystemExit(0)

    monkeypatch.setattr(faust.Worker, "execute_from_commandline", lambda self: stopped_by_mode())
    with pytest.raises(SystemExit) as plain:
        w.execute_from_commandline()
    assert plain.value.code == 0  # a stop for any other reason keeps its status

    w.stop_stalled("input partitions make no progress (...)")
    assert scheduled == [signal.SIGTERM]  # the graceful stop, bounded by stop_timeout_s
    with pytest.raises(SystemExit) as stalled:
        w.execute_from_commandline()
    assert stalled.value.code == worker.EX_STALLED == 75
