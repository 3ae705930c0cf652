"""Every Prometheus metric of a worker, and the small API the runner records them with.

One :class:`Metrics` object per process holds its own ``CollectorRegistry`` (never the global
default registry), so tests can build several side by side. The live runner calls one method per
point of interest (``metrics.event_in(topic)``, ``metrics.dead_letter(stage)``, ...); the
names and labels are defined here only. Names follow the Prometheus conventions: counters end
in ``_total``, units are in the names, times are in seconds.

May import prometheus_client and the package's models; never faust or Kafka clients.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..models import (
    Comparison,
    DriftAlert,
    LedgerState,
    RoutingShare,
    Selection,
    WindowSummary,
)
from .progress import ProgressWatch

__all__ = ["CONTENT_TYPE", "METRICS", "Metrics", "lag_of"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

FEEDBACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)

METRICS: dict[str, str] = {
    "trajstream_worker_info": "the worker's name and app_id (always 1)",
    "trajstream_events_in_total": "records read by the stages, per topic (ticks included)",
    "trajstream_dead_letters_total": "records sent to <p>.dead-letters, per stage",
    "trajstream_decisions_total": "selection decisions, per decision (selected, rejected) "
    "and reason",
    "trajstream_late_events_total": "events that arrived after their call closed (<p>.late-events)",
    "trajstream_shadow_calls_lost_total": "shadowed calls none of whose requests Trinity "
    "answered in the background (down or slow): nothing to train, production answered them",
    "trajstream_open_calls": "calls this worker holds open (events seen, not closed yet)",
    "trajstream_feedback_latency_seconds": "histogram: from the first POST /feedback of a "
    "rewarded trajectory to Trinity's acknowledgement, retries included",
    "trajstream_feedback_retries_total": "POST /feedback attempts retried (Trinity unavailable)",
    "trajstream_judge_verdicts_total": "verdicts of the LLM judge stage, per result (scored; "
    "failed: a garbage answer, rejected, or unavailable past reward.judge.max_age_s)",
    "trajstream_judge_retries_total": "judge requests retried (the judge unavailable)",
    "trajstream_trinity_errors_total": "failed Trinity requests, per route (feedback, commit, "
    "metrics) and error (unavailable, rejected, invalid)",
    "trajstream_commits_total": "commits recorded, per result (sent; not_sent: nothing ready "
    "at Trinity; held: commit.hold_on_drift after a reward drop)",
    "trajstream_last_commit_timestamp_seconds": "Unix time of the last commit (on the worker "
    "that holds the ledger)",
    "trajstream_seconds_since_last_commit": "seconds since the last commit (on the worker that "
    "holds the ledger, once it has committed)",
    "trajstream_feedback_uncommitted": "acknowledged feedbacks waiting for the next commit",
    "trajstream_consumer_lag_records": "records not yet committed by the group, per topic and "
    "partition assigned to this worker",
    "trajstream_reward_window_mean": "mean reward of the last closed window, per agent and model",
    "trajstream_reward_window_trajectories": "trajectories in the last closed window, per agent "
    "and model",
    "trajstream_drift_alerts_total": "reward drift alerts raised, per agent and model",
    "trajstream_compare_mean": "mean reward of an arm (policy, production) in the last "
    "comparison, per agent and span (window, trailing)",
    "trajstream_compare_calls": "calls of an arm in the last comparison, per agent and span; arm "
    "fallback and mixed: calls routed to the policy that production answered in whole or in "
    "part (in neither arm's mean)",
    "trajstream_compare_fallback_rate": "share of the calls routed to the policy that fell back "
    "to production (in whole or in part) in the last comparison, per agent and span",
    "trajstream_compare_policy_version": "the policy version of the last comparison that named "
    "one, per agent",
    "trajstream_compare_difference": "policy mean - production mean in the last comparison, "
    "per agent and span",
    "trajstream_compare_difference_lower": "lower bound of its confidence interval (Welch)",
    "trajstream_compare_difference_upper": "upper bound of its confidence interval (Welch)",
    "trajstream_routing_share": "the policy's share of an agent's traffic last decided "
    "(gateway.rollout)",
    "trajstream_routing_changes_total": "routing changes, per agent and action (start, "
    "promote, blocked, rollback, drift, set, resume)",
    "trajstream_assigned_partitions": "input topic partitions assigned to this worker",
    "trajstream_ready": "1 when partitions are assigned and the tables are recovered",
    "trajstream_recovery_stalled_seconds": "while the tables of an assignment recover: seconds "
    "since their recovery last read a record (0 otherwise)",
    "trajstream_consumption_stalled_seconds": "per watched input partition with records "
    "waiting: seconds since the group's committed offset last moved (absent when it moves)",
}
"""Every metric name with what it counts (docs/reference/metrics.md is generated from this)."""


class Metrics:
    """A worker's metrics and its readiness, in a registry of its own.

    ``inputs`` names the topics the worker consumes: only their partitions count as assigned
    (not changelogs, not Faust's leader topic) and have a lag. ``clock`` is the wall clock,
    a seam for tests.
    """

    def __init__(
        self,
        *,
        worker: str = "",
        app_id: str = "",
        inputs: Collection[str] = (),
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.inputs = frozenset(inputs)
        self._clock = clock
        self._open_calls: Callable[[], int] | None = None
        self._last_commit: float | None = None
        self._assigned: frozenset[tuple[str, int]] = frozenset()
        self._recovered = False
        self._recovery_position: Callable[[], int] | None = None
        self._recovery_stall_s = math.inf
        self._recovery_at: tuple[int, float] | None = None  # (position, when it last moved)
        self.progress = ProgressWatch(math.inf, clock=clock)
        self._progress_watched = False
        r = self.registry

        def doc(name: str) -> str:
            return METRICS[name]

        Info("trajstream_worker", doc("trajstream_worker_info"), registry=r).info(
            {"worker": worker, "app_id": app_id}
        )
        self._events = Counter(
            "trajstream_events_in", doc("trajstream_events_in_total"), ["topic"], registry=r
        )
        self._dead = Counter(
            "trajstream_dead_letters", doc("trajstream_dead_letters_total"), ["stage"], registry=r
        )
        self._decisions = Counter(
            "trajstream_decisions",
            doc("trajstream_decisions_total"),
            ["decision", "reason"],
            registry=r,
        )
        self._late = Counter(
            "trajstream_late_events", doc("trajstream_late_events_total"), registry=r
        )
        self._shadow_lost = Counter(
            "trajstream_shadow_calls_lost", doc("trajstream_shadow_calls_lost_total"), registry=r
        )
        self._feedback = Histogram(
            "trajstream_feedback_latency_seconds",
            doc("trajstream_feedback_latency_seconds"),
            buckets=FEEDBACK_BUCKETS,
            registry=r,
        )
        self._retries = Counter(
            "trajstream_feedback_retries", doc("trajstream_feedback_retries_total"), registry=r
        )
        self._judge = Counter(
            "trajstream_judge_verdicts",
            doc("trajstream_judge_verdicts_total"),
            ["result"],
            registry=r,
        )
        self._judge_retries = Counter(
            "trajstream_judge_retries", doc("trajstream_judge_retries_total"), registry=r
        )
        self._trinity = Counter(
            "trajstream_trinity_errors",
            doc("trajstream_trinity_errors_total"),
            ["route", "error"],
            registry=r,
        )
        self._commits = Counter(
            "trajstream_commits", doc("trajstream_commits_total"), ["result"], registry=r
        )
        self._commit_ts = Gauge(
            "trajstream_last_commit_timestamp_seconds",
            doc("trajstream_last_commit_timestamp_seconds"),
            registry=r,
        )
        self._uncommitted = Gauge(
            "trajstream_feedback_uncommitted", doc("trajstream_feedback_uncommitted"), registry=r
        )
        self._lag = Gauge(
            "trajstream_consumer_lag_records",
            doc("trajstream_consumer_lag_records"),
            ["topic", "partition"],
            registry=r,
        )
        self._window_mean = Gauge(
            "trajstream_reward_window_mean",
            doc("trajstream_reward_window_mean"),
            ["agent", "model"],
            registry=r,
        )
        self._window_count = Gauge(
            "trajstream_reward_window_trajectories",
            doc("trajstream_reward_window_trajectories"),
            ["agent", "model"],
            registry=r,
        )
        self._alerts = Counter(
            "trajstream_drift_alerts",
            doc("trajstream_drift_alerts_total"),
            ["agent", "model"],
            registry=r,
        )
        self._cmp_mean = Gauge(
            "trajstream_compare_mean",
            doc("trajstream_compare_mean"),
            ["agent", "arm", "span"],
            registry=r,
        )
        self._cmp_calls = Gauge(
            "trajstream_compare_calls",
            doc("trajstream_compare_calls"),
            ["agent", "arm", "span"],
            registry=r,
        )
        self._cmp_fallback_rate = Gauge(
            "trajstream_compare_fallback_rate",
            doc("trajstream_compare_fallback_rate"),
            ["agent", "span"],
            registry=r,
        )
        self._cmp_version = Gauge(
            "trajstream_compare_policy_version",
            doc("trajstream_compare_policy_version"),
            ["agent"],
            registry=r,
        )
        self._cmp_diff = {
            part: Gauge(name, doc(name), ["agent", "span"], registry=r)
            for part, name in (
                ("difference", "trajstream_compare_difference"),
                ("lower", "trajstream_compare_difference_lower"),
                ("upper", "trajstream_compare_difference_upper"),
            )
        }
        self._share = Gauge(
            "trajstream_routing_share", doc("trajstream_routing_share"), ["agent"], registry=r
        )
        self._routing = Counter(
            "trajstream_routing_changes",
            doc("trajstream_routing_changes_total"),
            ["agent", "action"],
            registry=r,
        )
        self._assigned_g = Gauge(
            "trajstream_assigned_partitions", doc("trajstream_assigned_partitions"), registry=r
        )
        self._ready_g = Gauge("trajstream_ready", doc("trajstream_ready"), registry=r)
        r.register(_Derived(self))

    # -- recording API: one call per point in the runner -------------------------------------

    def event_in(self, topic: str) -> None:
        """A stage read one record from ``topic``."""
        self._events.labels(topic).inc()

    def dead_letter(self, stage: str) -> None:
        self._dead.labels(stage).inc()

    def decision(self, selection: Selection) -> None:
        """A call closed and its selection was decided."""
        self._decisions.labels(
            "selected" if selection.selected else "rejected", selection.reason
        ).inc()

    def late_event(self) -> None:
        self._late.inc()

    def shadow_calls_lost(self, n: int) -> None:
        """``n`` shadowed calls closed without one shadow answer of Trinity's."""
        self._shadow_lost.inc(n)

    def feedback_acked(self, seconds: float) -> None:
        """Trinity acknowledged a feedback ``seconds`` after its first attempt."""
        self._feedback.observe(max(0.0, seconds))

    def feedback_retry(self) -> None:
        self._retries.inc()

    def judge_verdict(self, scored: bool) -> None:
        """The judge stage made a verdict: with a score, or failed."""
        self._judge.labels("scored" if scored else "failed").inc()

    def judge_retry(self) -> None:
        self._judge_retries.inc()

    def trinity_error(self, route: str, exc: BaseException) -> None:
        """A Trinity request on ``route`` failed with ``exc`` (a TrinityError)."""
        name = type(exc).__name__
        error = {"TrinityUnavailable": "unavailable", "TrinityRejected": "rejected"}.get(
            name, "invalid"
        )
        self._trinity.labels(route, error).inc()

    def commit(self, *, sent: bool, held: bool = False) -> None:
        """A commit was recorded on <p>.commits (``sent=False``: nothing ready at Trinity, or
        ``held`` on a reward drop)."""
        self._commits.labels("sent" if sent else "held" if held else "not_sent").inc()

    def ledger(self, state: LedgerState) -> None:
        """The ledger's state after a batch: when it last committed, what waits for a commit."""
        self._uncommitted.set(state.batch_count)
        if state.last_commit is not None:
            self._last_commit = state.last_commit.timestamp()
            self._commit_ts.set(self._last_commit)

    def window(self, summary: WindowSummary) -> None:
        """A reward window closed."""
        self._window_mean.labels(summary.agent_name, summary.model).set(summary.mean)
        self._window_count.labels(summary.agent_name, summary.model).set(summary.count)

    def drift_alert(self, alert: DriftAlert) -> None:
        self._alerts.labels(alert.agent_name, alert.model).inc()

    def comparison(self, c: Comparison) -> None:
        """A comparison of the policy with production was published (one of a single policy
        version, of a window several answered, sets only the version)."""
        if c.policy_version is not None:
            self._cmp_version.labels(c.agent_name).set(c.policy_version)
        if c.span == "version":
            return
        self._cmp_calls.labels(c.agent_name, "fallback", c.span).set(c.policy_fallbacks)
        self._cmp_calls.labels(c.agent_name, "mixed", c.span).set(c.policy_mixed)
        rate = c.fallback_rate
        self._cmp_fallback_rate.labels(c.agent_name, c.span).set(math.nan if rate is None else rate)
        for arm, mean, count in (
            ("policy", c.policy_mean, c.policy_count),
            ("production", c.production_mean, c.production_count),
        ):
            self._cmp_calls.labels(c.agent_name, arm, c.span).set(count)
            self._cmp_mean.labels(c.agent_name, arm, c.span).set(math.nan if mean is None else mean)
        for part, value in (("difference", c.difference), ("lower", c.lower), ("upper", c.upper)):
            self._cmp_diff[part].labels(c.agent_name, c.span).set(
                math.nan if value is None else value
            )

    def routing(self, change: RoutingShare) -> None:
        """The ledger owner changed an agent's share."""
        self._share.labels(change.agent_name).set(change.share)
        self._routing.labels(change.agent_name, change.action).inc()

    def watch_open_calls(self, count: Callable[[], int]) -> None:
        """Read the number of open calls at every scrape (e.g. ``len(pending_table)``)."""
        self._open_calls = count

    def consumer_lag(self, lag: Mapping[tuple[str, int], int]) -> None:
        """Replace the lag of every assigned input partition (``(topic, partition) -> records``)."""
        self._lag.clear()
        for (topic, partition), records in lag.items():
            if not self.inputs or topic in self.inputs:
                self._lag.labels(topic, str(partition)).set(max(0, records))

    # -- readiness ---------------------------------------------------------------------------

    def partitions_revoked(self) -> None:
        """A rebalance began: not ready until the next assignment has recovered its tables."""
        self._recovered = False
        self._recovery_at = None
        self.progress.reset()
        self._ready_g.set(0)

    def partitions_assigned(self, assigned: Iterable[Any]) -> None:
        """The new assignment: topic partitions as (topic, partition) pairs or objects with
        ``topic`` and ``partition`` attributes (Faust's TP)."""
        pairs = set()
        for tp in assigned:
            topic, partition = (tp.topic, tp.partition) if hasattr(tp, "topic") else tp
            if not self.inputs or topic in self.inputs:
                pairs.add((str(topic), int(partition)))
        self._assigned = frozenset(pairs)
        self._recovery_at = None
        self._assigned_g.set(len(pairs))
        self._ready_g.set(1 if self.ready else 0)

    def tables_recovered(self) -> None:
        """The tables of the current assignment are recovered; the stages are running."""
        self._recovered = True
        self._ready_g.set(1 if self.ready else 0)

    @property
    def ready(self) -> bool:
        return self._recovered and bool(self._assigned)

    def watch_recovery(self, position: Callable[[], int], stall_s: float) -> None:
        """Read the tables' recovery position (any number that changes as the recovery reads,
        e.g. the sum of its changelog offsets) whenever health is asked; a recovery that has
        not moved for ``stall_s`` seconds is stalled (:meth:`recovery_stalled`)."""
        self._recovery_position = position
        self._recovery_stall_s = stall_s

    def watch_progress(self, stall_s: float) -> None:
        """Judge the input partitions sampled with :meth:`consumption` (see
        :mod:`.progress`): one with records waiting whose committed offset has not moved for
        ``stall_s`` seconds is stalled (:meth:`consumption_stalled`)."""
        self.progress.stall_s = stall_s
        self._progress_watched = True

    def consumption(self, offsets: Mapping[tuple[str, int], tuple[int | None, int | None]]) -> None:
        """One sample of the watched partitions: ``(end offset, committed offset)`` each."""
        self.progress.sample(offsets)

    def consumption_stalled(self) -> str:
        """The stalled partitions in words ("" when none is)."""
        return self.progress.describe()

    def recovery_stuck_for(self) -> float:
        """Seconds since the recovery of the current assignment last moved (sampled now); 0
        when no recovery runs (nothing assigned, or the tables recovered) or none is watched."""
        if self._recovery_position is None or not self._assigned or self._recovered:
            self._recovery_at = None
            return 0.0
        try:
            position = self._recovery_position()
        except Exception:  # mid-rebalance: the position cannot be read; it counts as moving
            self._recovery_at = None
            return 0.0
        now = self._clock()
        if self._recovery_at is None or self._recovery_at[0] != position:
            self._recovery_at = (position, now)
        return max(0.0, now - self._recovery_at[1])

    def recovery_stalled(self) -> float | None:
        """How long the recovery has not moved, once that is ``stall_s`` or more (else None)."""
        stuck = self.recovery_stuck_for()
        return stuck if stuck >= self._recovery_stall_s else None

    def stall_reason(self) -> str | None:
        """Why this worker is stalled in a way a restart cures (what ``/healthz`` answers 503
        with, and what the worker's exit on a lasting stall logs), or None."""
        stalled = self.recovery_stalled()
        if stalled is not None:
            return (
                f"the tables' recovery has read nothing for {stalled:.0f} s "
                "(observe.recovery_stall_s): restarting the worker lets another start it again"
            )
        stuck = self.consumption_stalled()
        if stuck:
            return (
                f"input partitions make no progress ({stuck}; observe.consumption_stall_s): "
                "restarting the worker makes the group hand them out again"
            )
        return None

    @property
    def assigned(self) -> frozenset[tuple[str, int]]:
        return self._assigned

    @property
    def recovered(self) -> bool:
        return self._recovered

    # -- reading -----------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's value, or None (for tests and the status command)."""
        return self.registry.get_sample_value(name, labels or None)


class _Derived(Collector):
    """Values computed at scrape time: open calls, how long a recovery or a watched input
    partition has not moved, and the age of the last commit."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m = self.m
        if m._open_calls is not None:
            family = GaugeMetricFamily("trajstream_open_calls", METRICS["trajstream_open_calls"])
            try:
                family.add_metric([], float(m._open_calls()))
            except Exception:  # a table in the middle of a rebalance: no sample this time
                family.add_metric([], math.nan)
            yield family
        if m._recovery_position is not None:
            family = GaugeMetricFamily(
                "trajstream_recovery_stalled_seconds",
                METRICS["trajstream_recovery_stalled_seconds"],
            )
            family.add_metric([], m.recovery_stuck_for())
            yield family
        if m._progress_watched:
            family = GaugeMetricFamily(
                "trajstream_consumption_stalled_seconds",
                METRICS["trajstream_consumption_stalled_seconds"],
                labels=["topic", "partition"],
            )
            for (topic, partition), seconds in sorted(m.progress.stuck().items()):
                family.add_metric([topic, str(partition)], seconds)
            yield family
        if m._last_commit is not None:
            family = GaugeMetricFamily(
                "trajstream_seconds_since_last_commit",
                METRICS["trajstream_seconds_since_last_commit"],
            )
            family.add_metric([], max(0.0, m._clock() - m._last_commit))
            yield family


def lag_of(
    assignment: Iterable[Any],
    end: Callable[[Any], int | None],
    committed: Callable[[Any], int | None],
) -> dict[tuple[str, int], int]:
    """Consumer lag per partition: end offset minus the group's committed offset.

    ``end(tp)`` and ``committed(tp)`` may return None (not known yet: the partition is skipped;
    never committed: counted from offset 0) or raise (mid-rebalance: skipped).
    """
    out: dict[tuple[str, int], int] = {}
    for tp in assignment:
        try:
            last = end(tp)
            done = committed(tp)
        except Exception:
            continue
        if last is None:
            continue
        out[(tp.topic, tp.partition)] = max(0, int(last) - int(done or 0))
    return out
