"""Trinity as the live worker's ports see it (streams/runtime/live/trinity.py): the client made
when first used, its failures counted by route and kind. (The gate it passes: test_checkpoint.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from streams.errors import TrinityUnavailable
from streams.observe.metrics import Metrics
from streams.runtime.live.checkpoint import FeedbackGate
from streams.runtime.live.trinity import ObservedTrinity

from .test_feedback import Trinity


async def test_the_client_is_made_when_first_used_and_its_failures_counted() -> None:
    made: list[Trinity] = []
    metrics = Metrics()

    def client() -> Any:
        made.append(Trinity(TrinityUnavailable("503", status=503)))
        return made[-1]

    observed = ObservedTrinity(client, metrics, FeedbackGate())
    await observed.aclose()  # never used: nothing to close
    assert made == []
    with pytest.raises(TrinityUnavailable):
        await observed.feedback(["m"], 1.0, "task", 0)
    await observed.feedback(["m"], 1.0, "task", 0)
    assert len(made) == 1 and made[0].acked == [["m"]]
    labels = {"route": "feedback", "error": "unavailable"}
    assert metrics.registry.get_sample_value("trajstream_trinity_errors_total", labels) == 1
    await observed.aclose()
    assert made[0].closed
