"""The one retry loop (streams.io.trinity.retrying) under a fake clock and sleep: retries while
Trinity is unavailable, gives up after max_age, never retries a rejection."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.core.retry import GiveUp, RetryPolicy
from streams.errors import TrinityRejected, TrinityUnavailable
from streams.io.trinity import TrinityGaveUp, retrying


class Fake:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = list(failures)
        self.now = 0.0
        self.slept: list[float] = []

    async def call(self) -> str:
        if self.failures:
            raise self.failures.pop(0)
        return "ok"

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += delay


def run(fake: Fake, policy: RetryPolicy) -> Any:
    return asyncio.run(
        retrying(fake.call, policy, "test", sleep=fake.sleep, clock=lambda: fake.now)
    )


@pytest.mark.parametrize(
    ("failures", "max_age", "outcome"),
    [
        ([], 60, (1, "ok")),
        ([TrinityUnavailable("503")] * 3, 60, (4, "ok")),
        ([TrinityUnavailable("503")] * 100, 5, TrinityGaveUp),
        ([TrinityRejected("400")], 60, TrinityRejected),
        ([TrinityUnavailable("503"), TrinityRejected("400")], 60, TrinityRejected),
    ],
)
def test_retrying(failures: list[Exception], max_age: float, outcome: Any) -> None:
    fake = Fake(failures)
    policy = RetryPolicy(max_age=max_age)
    if isinstance(outcome, tuple):
        assert run(fake, policy) == outcome
        assert len(fake.slept) == len(failures)
    else:
        with pytest.raises(outcome):
            run(fake, policy)
        assert fake.now <= max_age  # never sleeps past the policy's age


def test_giving_up_says_how_long_and_how_often() -> None:
    fake = Fake([TrinityUnavailable("503 from /feedback")] * 100)
    with pytest.raises(TrinityGaveUp) as info:
        run(fake, RetryPolicy(max_age=3))
    assert str(info.value).startswith("Trinity unavailable for 3s (")
    assert "503 from /feedback" in str(info.value)
    assert info.value.attempts == len(fake.slept) + 1


@pytest.mark.parametrize(
    ("elapsed", "delay", "retry"), [(0, 0.2, True), (9.8, 0.2, True), (9.9, 0.2, False)]
)
def test_the_decision(elapsed: float, delay: float, retry: bool) -> None:
    decision = RetryPolicy(max_age=10).decide(3, elapsed, delay, "503")
    assert (not isinstance(decision, GiveUp)) == retry
