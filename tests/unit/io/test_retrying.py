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


def test_one_loop_for_every_service_counting_the_age_from_where_it_is_told() -> None:
    # the judge's age runs from its request's requested_at: 50 s old already, max_age 60
    from streams.errors import JudgeGaveUp, JudgeRejected, JudgeUnavailable
    from streams.io.retrying import retrying as generic

    fake = Fake([JudgeUnavailable("503", body="busy")] * 100)
    policy = RetryPolicy(max_age=60, base=4, cap=4, service="the judge")
    with pytest.raises(JudgeGaveUp) as gave_up:
        asyncio.run(
            generic(
                fake.call,
                policy,
                "judge",
                gave_up=JudgeGaveUp,
                sleep=fake.sleep,
                elapsed=lambda: 50 + fake.now,
            )
        )
    # attempts at ages 50, ~54, ~58: the next would start after 60
    assert gave_up.value.attempts == 3 and gave_up.value.body == "busy"
    assert "the judge unavailable for 60s" in str(gave_up.value)
    fake = Fake([JudgeRejected("400")])
    with pytest.raises(JudgeRejected):
        asyncio.run(generic(fake.call, policy, "judge", sleep=fake.sleep))
    assert fake.slept == []
