"""The comparison: the policy's rewards against production's, per agent, with a confidence interval.

Both arms are scored by the same reward function on the same agents at the same time
(:mod:`streams.core.arms`); the ledger closes a reward window per agent x model x upstream, the
policy's per version too. :func:`compare_windows` turns the windows the ledger closed in one
decision into one :class:`~streams.models.Comparison` per agent and window (the models and
versions of an arm pooled, ``span: window``), one per policy version of a window that several
versions answered (``span: version``: that version's calls against the same production calls),
and one over a trailing span of the last ``trailing_windows`` windows of each agent.

Fallbacks
  A call routed to the policy that production answered, in whole (``trinity-fallback``) or in
  part (``mixed``), is in neither arm's mean: what the policy did not answer says nothing of
  its quality. It is counted beside the means (``policy_fallbacks``, ``policy_mixed``, and the
  ``fallback_rate`` of the calls routed to the policy), so a policy that answers well but
  seldom is seen as such; the rollout does not promote it while that rate is high
  (:mod:`streams.core.rollout`). Fallbacks carry no policy version (production answered), so a
  window's counts stand on each of its comparisons, whatever their version.

The statistics
  The difference is ``policy mean - production mean``; its interval is **Welch's t interval**
  (unequal variances, Welch-Satterthwaite degrees of freedom):
  ``se = sqrt(s1²/n1 + s2²/n2)``, ``df = se⁴ / ((s1²/n1)²/(n1-1) + (s2²/n2)²/(n2-1))``,
  ``difference ± t(1 - (1-level)/2, df) · se``, with sample variances (n - 1). The Student t
  quantile is computed here (:func:`t_quantile`: the regularized incomplete beta function by
  its continued fraction, inverted by bisection), with no scipy. An arm with fewer than
  ``min_count`` calls (at least 2) makes the comparison ``insufficient``; otherwise it is
  ``better`` or ``worse`` when the interval excludes zero, else ``inconclusive``.

Repeated looks
  A per-window comparison is a fixed-sample test of that window's calls only: windows hold
  disjoint calls, so looking at each new window is not the optional stopping that breaks a
  fixed-sample test (which is about re-testing one growing sample). The rollout
  (:mod:`streams.core.rollout`) acts only on ``N`` consecutive per-window verdicts: under no
  difference, ``N`` consecutive "better" verdicts happen with probability at most
  ``((1 - level)/2)^N`` for any given ``N`` windows (2.5e-2³ ≈ 1.6e-5 with 0.95 and N = 3), which
  is the false-promotion rate per window of a long run. The **trailing** comparison pools
  overlapping windows and is re-tested at every window: it is a display of the recent trend,
  not valid under repeated looks, and no decision rests on it. (A confidence sequence that stays
  valid at every look would be the alternative; it needs a known variance bound or much wider
  intervals for the same data, which is why the rollout uses disjoint windows instead.)

May import: the standard library, :mod:`streams.models`, :mod:`streams.core.arms`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ..models import Comparison, LedgerState, WindowAccumulator, WindowSummary
from .arms import FALLBACK, MIXED, POLICY, PRODUCTION

__all__ = [
    "Arm",
    "CompareConfig",
    "Interval",
    "arm_of_summary",
    "compare_arms",
    "compare_windows",
    "incomplete_beta",
    "pool",
    "t_cdf",
    "t_quantile",
    "welch",
]


@dataclass(frozen=True, slots=True)
class CompareConfig:
    level: float = 0.95
    min_count: int = 10
    trailing_windows: int = 10


# -- the Student t distribution ------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on
    :func:`t_cdf` to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


# -- Welch's interval ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm's sample: count, mean and the sum of squared deviations (Welford's M2)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def variance(self) -> float | None:
        """The sample variance (n - 1); None below two calls."""
        return self.m2 / (self.count - 1) if self.count >= 2 else None

    @property
    def stddev(self) -> float | None:
        v = self.variance
        return None if v is None else math.sqrt(max(v, 0.0))

    @classmethod
    def of(cls, values: Iterable[float]) -> Arm:
        arm = cls()
        for v in values:
            arm = pool([arm, cls(1, v, 0.0)])
        return arm


def pool(arms: Iterable[Arm]) -> Arm:
    """Several samples as one (Chan et al.'s parallel combination of count, mean and M2)."""
    n, mean, m2 = 0, 0.0, 0.0
    for arm in arms:
        if arm.count == 0:
            continue
        total = n + arm.count
        delta = arm.mean - mean
        mean += delta * arm.count / total
        m2 += arm.m2 + delta * delta * n * arm.count / total
        n = total
    return Arm(n, mean, m2)


@dataclass(frozen=True, slots=True)
class Interval:
    difference: float
    lower: float
    upper: float
    df: float


def welch(policy: Arm, production: Arm, level: float) -> Interval | None:
    """Welch's t interval of ``policy.mean - production.mean`` at ``level``; None when an arm
    has fewer than two calls. With no variance on either side the interval is the point."""
    v1, v2 = policy.variance, production.variance
    if v1 is None or v2 is None:
        return None
    diff = policy.mean - production.mean
    a, b = v1 / policy.count, v2 / production.count
    se2 = a + b
    if se2 <= 0.0:
        return Interval(diff, diff, diff, float(policy.count + production.count - 2))
    df = se2 * se2 / (a * a / (policy.count - 1) + b * b / (production.count - 1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * math.sqrt(se2)
    return Interval(diff, diff - half, diff + half, df)


def compare_arms(
    agent: str,
    policy: Arm,
    production: Arm,
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    cfg: CompareConfig,
    span: str = "window",
    windows: int = 1,
    policy_version: int | None = None,
    fallbacks: int = 0,
    mixed: int = 0,
    routed: int | None = None,
) -> Comparison:
    """The comparison record of two arms' samples; ``fallbacks`` and ``mixed`` calls of the
    policy counted beside them, their rate over ``routed`` calls (default: the policy's calls
    and these)."""
    interval = welch(policy, production, cfg.level)
    enough = min(policy.count, production.count) >= max(2, cfg.min_count)
    if interval is None or not enough:
        verdict = "insufficient"
    elif interval.lower > 0:
        verdict = "better"
    elif interval.upper < 0:
        verdict = "worse"
    else:
        verdict = "inconclusive"
    routed = policy.count + fallbacks + mixed if routed is None else routed
    return Comparison(
        agent_name=agent,
        span=span if span in ("trailing", "version") else "window",  # type: ignore[arg-type]
        window_start=start,
        window_end=end,
        windows=windows,
        policy_count=policy.count,
        policy_mean=policy.mean if policy.count else None,
        policy_stddev=policy.stddev,
        production_count=production.count,
        production_mean=production.mean if production.count else None,
        production_stddev=production.stddev,
        difference=interval.difference if interval else None,
        lower=interval.lower if interval else None,
        upper=interval.upper if interval else None,
        level=cfg.level,
        df=interval.df if interval else None,
        method="welch",
        verdict=verdict,  # type: ignore[arg-type]
        emitted_at=now,
        policy_version=policy_version,
        policy_fallbacks=fallbacks,
        policy_mixed=mixed,
        fallback_rate=(fallbacks + mixed) / routed if routed else None,
    )


# -- from the ledger's windows ---------------------------------------------------------------------


def arm_of_summary(summary: WindowSummary) -> Arm:
    """A window summary's sample (its stddev is the population one: M2 = stddev² · n)."""
    return Arm(summary.count, summary.mean, summary.stddev * summary.stddev * summary.count)


ARMS = (POLICY, PRODUCTION, FALLBACK, MIXED)
"""The upstreams a comparison reads: its two arms, and the policy's fallbacks it counts."""


def compare_windows(
    state: LedgerState, summaries: list[WindowSummary], now: datetime, cfg: CompareConfig
) -> list[Comparison]:
    """Per agent and window among ``summaries`` that has a window of either arm or a fallback
    (oldest first): one comparison of the arms (``span: window``), then, when several policy
    versions answered the window, one per version (``span: version``, oldest first); then one
    over the trailing span of each of those agents. Keeps each arm's last ``trailing_windows``
    windows in ``state.arm_windows`` (every version pooled)."""
    grouped: dict[tuple[str, datetime], dict[str, list[WindowSummary]]] = {}
    for s in summaries:
        if s.upstream in ARMS:
            arms = grouped.setdefault((s.agent_name, s.window_start), {a: [] for a in ARMS})
            arms[s.upstream].append(s)
    out: list[Comparison] = []
    agents: dict[str, None] = {}
    for (agent, start), arms in sorted(grouped.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pooled = {name: pool(map(arm_of_summary, windows)) for name, windows in arms.items()}
        out += _of_window(agent, start, arms, pooled, now, cfg)
        for name, arm in pooled.items():
            if arm.count or name in (POLICY, PRODUCTION):
                _remember(state, agent, name, start, arm, cfg.trailing_windows)
        agents[agent] = None
    for agent in agents:
        kept = [w for w in state.arm_windows if w.agent_name == agent]
        starts = sorted({w.window_start for w in kept})
        arms_of = {
            name: pool(Arm(w.count, w.mean, w.m2) for w in kept if w.upstream == name)
            for name in ARMS
        }
        window = max(s.window_end - s.window_start for s in summaries if s.agent_name == agent)
        out.append(
            compare_arms(
                agent,
                arms_of[POLICY],
                arms_of[PRODUCTION],
                start=starts[0],
                end=starts[-1] + window,
                now=now,
                cfg=cfg,
                span="trailing",
                windows=len(starts),
                fallbacks=arms_of[FALLBACK].count,
                mixed=arms_of[MIXED].count,
            )
        )
    return out


def _of_window(
    agent: str,
    start: datetime,
    arms: dict[str, list[WindowSummary]],
    pooled: dict[str, Arm],
    now: datetime,
    cfg: CompareConfig,
) -> list[Comparison]:
    """The comparisons of one agent's window: the arms, then each version of several."""
    end = max(s.window_end for windows in arms.values() for s in windows)
    falls, mixed = pooled[FALLBACK].count, pooled[MIXED].count
    routed = pooled[POLICY].count + falls + mixed

    def versus(policy: Arm, span: str = "window", version: int | None = None) -> Comparison:
        return compare_arms(
            agent,
            policy,
            pooled[PRODUCTION],
            start=start,
            end=end,
            now=now,
            cfg=cfg,
            span=span,
            policy_version=version,
            fallbacks=falls,
            mixed=mixed,
            routed=routed,
        )

    versions = sorted({s.policy_version for s in arms[POLICY]}, key=_version_order)
    out = [versus(pooled[POLICY], version=versions[0] if len(versions) == 1 else None)]
    if len(versions) > 1:  # several versions answered: each is compared on its own calls
        for version in (v for v in versions if v is not None):
            calls = (arm_of_summary(s) for s in arms[POLICY] if s.policy_version == version)
            out.append(versus(pool(calls), "version", version))
    return out


def _version_order(version: int | None) -> int:
    return -1 if version is None else version


def _remember(
    state: LedgerState, agent: str, upstream: str, start: datetime, arm: Arm, keep: int
) -> None:
    state.arm_windows.append(
        WindowAccumulator(
            agent_name=agent,
            model="*",
            window_start=start,
            count=arm.count,
            mean=arm.mean,
            m2=arm.m2,
            upstream=upstream,
        )
    )
    mine = sorted(
        {w.window_start for w in state.arm_windows if w.agent_name == agent}, reverse=True
    )
    if len(mine) > keep:
        cutoff = mine[keep - 1]
        state.arm_windows = [
            w for w in state.arm_windows if w.agent_name != agent or w.window_start >= cutoff
        ]
