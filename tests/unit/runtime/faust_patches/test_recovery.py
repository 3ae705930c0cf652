"""The recovery patch (streams/runtime/faust_patches/recovery.py), through Faust's own
``Recovery`` class as installed: fails where the patch is left out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.tables.recovery import Recovery


def test_recovery_completion_clears_queues_before_resuming_then_seeks() -> None:
    calls: list[str] = []

    class Signal:
        async def send(self) -> None:
            calls.append("rebalance_complete")

    async def perform_seek() -> None:
        calls.append("seek")

    async def wait(coro: Any, timeout: float) -> None:
        await coro

    async def maybe_start() -> None:
        calls.append("fetcher")

    consumer = SimpleNamespace(
        assignment=lambda: {"stream", "changelog"},
        resume_partitions=lambda tps: calls.append(f"resume_partitions {sorted(tps)}"),
        perform_seek=perform_seek,
        resume_flow=lambda: calls.append("resume_flow"),
    )
    app = SimpleNamespace(
        consumer=consumer,
        consumer_generation_id=3,
        on_rebalance_complete=Signal(),
        flow_control=SimpleNamespace(resume=lambda: calls.append("clear+resume")),
        conf=SimpleNamespace(broker_request_timeout=1.0),
        _fetcher=SimpleNamespace(maybe_start=maybe_start),
        assignor=SimpleNamespace(assigned_standbys=lambda: set()),
        on_rebalance_end=lambda: calls.append("end"),
    )
    recovery = SimpleNamespace(
        app=app,
        log=SimpleNamespace(info=lambda *a: None, dev=lambda *a: None, warning=lambda *a: None),
        _set_recovery_ended=lambda: None,
        _is_changelog_tp=lambda tp: tp == "changelog",
        _wait=wait,
        completed=SimpleNamespace(set=lambda: calls.append("completed")),
        tables=SimpleNamespace(
            values=lambda: [], on_actives_ready=lambda: None, on_standbys_ready=lambda: None
        ),
    )
    asyncio.run(Recovery.on_recovery_completed(recovery, generation_id=3))  # type: ignore[arg-type]
    assert calls[:5] == [
        "rebalance_complete",
        "clear+resume",
        "resume_partitions ['stream']",
        "seek",
        "completed",
    ]
    assert calls.count("clear+resume") == 1  # never again after the seek
