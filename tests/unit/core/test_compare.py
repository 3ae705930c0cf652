"""Unit tests of streams.core.compare against published values: Student t quantiles (printed
tables, 9-10 digits), R's Welch t.test on its ``sleep`` data, and the pooling of windows; the
policy's fallbacks counted beside the means, and the comparisons per policy version."""

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
    start: float,
    upstream: str | None,
    values: list[float],
    model: str = "m",
    version: int | None = None,
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
        policy_version=version,
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


HIGH = [0.9, 0.8, 1.0, 0.7, 0.9]
LOW = [0.2, 0.1, 0.3, 0.2, 0.0]
MID = [0.5, 0.4, 0.6, 0.5, 0.5]


def test_fallbacks_are_counted_beside_the_means_and_not_in_them() -> None:
    state = LedgerState()
    window, trailing = compare_windows(
        state,
        [
            summary(0, "trinity", HIGH),
            summary(0, "production", LOW),
            summary(0, "trinity-fallback", [0.0, 0.0]),  # production's answers: not the policy's
            summary(0, "mixed", [0.1]),
        ],
        at(70),
        CFG,
    )
    assert (window.policy_count, window.policy_mean) == (5, pytest.approx(statistics.fmean(HIGH)))
    assert (window.policy_fallbacks, window.policy_mixed) == (2, 1)
    assert window.fallback_rate == pytest.approx(3 / 8)
    assert window.verdict == "better"
    *_, trailing = compare_windows(
        state,
        [summary(60, "trinity", HIGH), summary(60, "production", LOW)],
        at(130),
        CFG,
    )
    assert (trailing.windows, trailing.policy_count, trailing.policy_fallbacks) == (2, 10, 2)
    assert trailing.fallback_rate == pytest.approx(3 / 13)


def test_a_window_the_policy_never_answered_is_all_fallbacks() -> None:
    window, _ = compare_windows(
        LedgerState(),
        [summary(0, "production", LOW), summary(0, "trinity-fallback", [0.5] * 4)],
        at(70),
        CFG,
    )
    assert (window.verdict, window.policy_count, window.policy_fallbacks) == ("insufficient", 0, 4)
    assert window.fallback_rate == 1.0


def test_a_window_one_version_answered_names_it() -> None:
    out = compare_windows(
        LedgerState(),
        [summary(0, "trinity", HIGH, version=3), summary(0, "production", LOW)],
        at(70),
        CFG,
    )
    assert [(c.span, c.policy_version) for c in out] == [("window", 3), ("trailing", None)]


@pytest.mark.parametrize(
    ("versions", "spans"),
    [
        ({3: HIGH, 4: LOW}, [("window", None), ("version", 3), ("version", 4)]),
        # calls whose version was not known are pooled in the window, never compared alone
        ({None: HIGH, 4: LOW}, [("window", None), ("version", 4)]),
        ({None: HIGH}, [("window", None)]),
    ],
)
def test_a_window_several_versions_answered_is_compared_per_version(
    versions: dict[int | None, list[float]], spans: list[tuple[str, int | None]]
) -> None:
    windows = [summary(0, "trinity", v, version=k) for k, v in versions.items()]
    out = compare_windows(
        LedgerState(),
        [*windows, summary(0, "production", MID), summary(0, "trinity-fallback", [0.0])],
        at(70),
        CFG,
    )
    assert [(c.span, c.policy_version) for c in out[:-1]] == spans
    pooled = out[0]
    assert pooled.policy_count == sum(len(v) for v in versions.values())
    for c in out[1:-1]:  # each version against the same production calls
        mine = versions[c.policy_version]
        direct = welch(Arm.of(mine), Arm.of(MID), 0.95)
        assert direct is not None and c.lower == pytest.approx(direct.lower)
        assert (c.policy_count, c.production_count) == (len(mine), len(MID))
        # the window's fallbacks, whatever the version (production answered them)
        assert (c.policy_fallbacks, c.fallback_rate) == (1, pooled.fallback_rate)
    verdicts = {c.policy_version: c.verdict for c in out if c.span == "version"}
    assert verdicts == {v: "better" if v == 3 else "worse" for v in versions if v is not None}
