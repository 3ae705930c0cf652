"""Unit tests of streams.core.compare against published values: Student t quantiles (printed
tables, 9-10 digits), R's Welch t.test on its ``sleep`` data, and the pooling of windows."""

from __future__ import annotations

import math
import statistics
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.compare import (
    Arm,
    CompareConfig,
    compare_arms,
    compare_windows,
    incomplete_beta,
    pool,
    t_cdf,
    t_quantile,
    welch,
)
from streams.models import LedgerState, WindowSummary
from tests.unit.factories import T0, at


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.706204736),
        (0.975, 2, 4.302652730),
        (0.975, 5, 2.570581836),
        (0.975, 10, 2.228138852),
        (0.975, 30, 2.042272456),
        (0.95, 10, 1.812461123),
        (0.995, 20, 2.845339710),
        (0.975, math.inf, 1.959963985),
        (0.025, 10, -2.228138852),
        (0.5, 7, 0.0),
    ],
)
def test_t_quantiles_match_the_tables(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-8)


def test_t_cdf_known_values() -> None:
    assert t_cdf(2.0, 3) == pytest.approx(0.930337016, abs=1e-9)
    assert t_cdf(0.0, 4) == 0.5
    assert t_cdf(-1.0, 1) == pytest.approx(0.25, abs=1e-12)  # Cauchy: 1/2 + atan(t)/pi
    assert incomplete_beta(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # closed form


@given(st.floats(0.001, 0.999), st.floats(0.5, 500))
@settings(max_examples=200, deadline=None)
def test_the_quantile_inverts_the_cdf(p: float, df: float) -> None:
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


# R: t.test(extra ~ group, data = sleep)  (Welch)
#   t = -1.8608, df = 17.776, 95 percent CI: -3.3654832  0.2054832, means 0.75 2.33
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_welch_matches_r_on_the_sleep_data() -> None:
    interval = welch(Arm.of(SLEEP_1), Arm.of(SLEEP_2), 0.95)
    assert interval is not None
    assert interval.difference == pytest.approx(0.75 - 2.33, abs=1e-12)
    assert (interval.lower, interval.upper) == pytest.approx((-3.3654832, 0.2054832), abs=1e-7)
    assert interval.df == pytest.approx(17.776, abs=5e-4)


def test_a_one_call_arm_has_no_interval() -> None:
    assert welch(Arm.of([1.0]), Arm.of([0.0, 1.0]), 0.95) is None


@given(st.lists(st.floats(-10, 10), min_size=1, max_size=30), st.integers(0, 30))
@settings(max_examples=200, deadline=None)
def test_pooled_windows_equal_the_sample_they_split(values: list[float], cut: int) -> None:
    cut = min(cut, len(values))
    both = pool([Arm.of(values[:cut]), Arm.of(values[cut:])])
    assert both.count == len(values)
    assert both.mean == pytest.approx(statistics.fmean(values), abs=1e-9)
    if len(values) >= 2:
        assert both.variance == pytest.approx(statistics.variance(values), abs=1e-7)


CFG = CompareConfig(level=0.95, min_count=5, trailing_windows=3)


@pytest.mark.parametrize(
    ("policy", "production", "verdict"),
    [
        ([0.9, 0.8, 1.0, 0.9, 0.85, 0.95], [0.1, 0.2, 0.0, 0.15, 0.1, 0.05], "better"),
        ([0.1, 0.2, 0.0, 0.15, 0.1, 0.05], [0.9, 0.8, 1.0, 0.9, 0.85, 0.95], "worse"),
        (SLEEP_1, SLEEP_2, "inconclusive"),
        ([1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0, 0.0], "insufficient"),  # 3 < min_count
    ],
)
def test_the_verdict(policy: list[float], production: list[float], verdict: str) -> None:
    got = compare_arms(
        "a", Arm.of(policy), Arm.of(production), start=T0, end=at(60), now=at(70), cfg=CFG
    )
    assert got.verdict == verdict
    assert got.policy_count == len(policy) and got.production_count == len(production)
    assert got.policy_mean == pytest.approx(statistics.fmean(policy))


def summary(
    start: float, upstream: str | None, values: list[float], model: str = "m"
) -> WindowSummary:
    return WindowSummary(
        window_start=at(start),
        window_end=at(start) + timedelta(seconds=60),
        agent_name="support",
        model=model,
        count=len(values),
        mean=statistics.fmean(values),
        min=min(values),
        max=max(values),
        stddev=statistics.pstdev(values),
        success_rate=1.0,
        emitted_at=at(start + 70),
        upstream=upstream,
    )


def test_windows_pool_the_models_of_an_arm_and_trail_over_the_last_windows() -> None:
    state = LedgerState()
    high = [0.9, 0.8, 1.0, 0.7, 0.9]
    low = [0.2, 0.1, 0.3, 0.2, 0.0]
    out = compare_windows(
        state,
        [
            summary(0, "trinity", high[:2], model="p1"),
            summary(0, "trinity", high[2:], model="p2"),
            summary(0, "production", low),
            summary(0, None, [0.5]),  # not routed: in neither arm
        ],
        at(70),
        CFG,
    )
    window, trailing = out
    assert (window.span, window.policy_count, window.production_count) == ("window", 5, 5)
    assert window.policy_mean == pytest.approx(statistics.fmean(high))
    assert window.policy_stddev == pytest.approx(statistics.stdev(high))
    direct = welch(Arm.of(high), Arm.of(low), 0.95)
    assert direct is not None and window.lower == pytest.approx(direct.lower)
    assert window.verdict == "better" and trailing.windows == 1
    for k in range(1, 5):  # three windows trail: the oldest drop out
        *_, trailing = compare_windows(
            state,
            [summary(60 * k, "trinity", low), summary(60 * k, "production", high)],
            at(60 * k + 70),
            CFG,
        )
    assert (trailing.span, trailing.windows) == ("trailing", 3)
    assert (trailing.policy_count, trailing.production_count) == (15, 15)
    assert trailing.window_start == at(120) and trailing.window_end == at(300)
    assert trailing.verdict == "worse"
    assert len(state.arm_windows) == 6


def test_an_agent_with_one_arm_only_is_insufficient() -> None:
    (window, _) = compare_windows(
        LedgerState(), [summary(0, "production", [0.1] * 20)], at(70), CFG
    )
    assert window.verdict == "insufficient" and window.policy_count == 0
    assert window.policy_mean is None and window.difference is None
