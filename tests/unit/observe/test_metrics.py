"""The metrics registry: names, labels, readiness and derived values, without a worker."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streams.errors import TrinityRejected, TrinityUnavailable
from streams.models import DriftAlert, LedgerState, Selection
from streams.observe.metrics import METRICS, Metrics, lag_of

from ..factories import T0, at


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


def test_every_metric_is_documented_and_every_documented_one_exposed():
    m = Metrics(worker="w", app_id="a", clock=lambda: 100.0)
    m.watch_open_calls(lambda: 2)
    m.watch_recovery(lambda: 0, stall_s=300)
    m.watch_progress(stall_s=120)
    m.ledger(LedgerState(last_commit=T0))  # the derived gauges appear once they have a value
    suffix = {"counter": "_total", "info": "_info"}
    exposed = {f.name + suffix.get(f.type, "") for f in m.registry.collect()}
    assert exposed == set(METRICS)
    for name in exposed:
        assert name.startswith("trajstream_")
    for family in text_string_to_metric_families(m.exposition().decode()):
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)


def test_counters_carry_their_labels():
    m = Metrics()
    m.event_in("t1")
    m.event_in("t1")
    m.dead_letter("reward")
    m.decision(Selection(selected=True, strategy="s", reason="marked"))
    m.decision(Selection(selected=False, strategy="s", reason="unmarked,not-sampled"))
    m.late_event()
    m.feedback_retry()
    m.trinity_error("feedback", TrinityUnavailable("down"))
    m.trinity_error("commit", TrinityRejected("no"))
    m.trinity_error("metrics", ValueError("odd"))
    m.commit(sent=True)
    m.commit(sent=False)
    m.drift_alert(
        DriftAlert(
            agent_name="a",
            model="m",
            window_start=T0,
            window_end=at(60),
            mean=0.1,
            trailing_mean=0.9,
            trailing_windows=3,
            fraction=0.8,
            raised_at=at(61),
        )
    )
    v = m.value
    assert v("trajstream_events_in_total", topic="t1") == 2
    assert v("trajstream_dead_letters_total", stage="reward") == 1
    assert v("trajstream_decisions_total", decision="selected", reason="marked") == 1
    assert v("trajstream_decisions_total", decision="rejected", reason="unmarked,not-sampled") == 1
    assert v("trajstream_late_events_total") == 1
    assert v("trajstream_feedback_retries_total") == 1
    assert v("trajstream_trinity_errors_total", route="feedback", error="unavailable") == 1
    assert v("trajstream_trinity_errors_total", route="commit", error="rejected") == 1
    assert v("trajstream_trinity_errors_total", route="metrics", error="invalid") == 1
    assert v("trajstream_commits_total", result="sent") == 1
    assert v("trajstream_commits_total", result="not_sent") == 1
    assert v("trajstream_drift_alerts_total", agent="a", model="m") == 1


def test_feedback_latency_is_a_histogram_in_seconds():
    m = Metrics()
    for seconds in (0.02, 0.3, 12.0):
        m.feedback_acked(seconds)
    assert m.value("trajstream_feedback_latency_seconds_count") == 3
    assert m.value("trajstream_feedback_latency_seconds_sum") == pytest.approx(12.32)
    assert m.value("trajstream_feedback_latency_seconds_bucket", le="0.5") == 2


def test_registries_are_separate():
    a, b = Metrics(), Metrics()
    a.late_event()
    assert a.value("trajstream_late_events_total") == 1
    assert b.value("trajstream_late_events_total") == 0


def test_seconds_since_last_commit_only_once_known():
    now = [T0.timestamp() + 30]
    m = Metrics(clock=lambda: now[0])
    assert m.value("trajstream_seconds_since_last_commit") is None
    m.ledger(LedgerState(last_commit=T0, batch_count=7))
    assert m.value("trajstream_seconds_since_last_commit") == pytest.approx(30)
    assert m.value("trajstream_last_commit_timestamp_seconds") == T0.timestamp()
    assert m.value("trajstream_feedback_uncommitted") == 7
    now[0] += 5
    assert m.value("trajstream_seconds_since_last_commit") == pytest.approx(35)


def test_open_calls_read_at_scrape_and_a_failing_read_is_nan():
    calls = {"n": 3}
    m = Metrics()
    assert m.value("trajstream_open_calls") is None
    m.watch_open_calls(lambda: calls["n"])
    assert m.value("trajstream_open_calls") == 3
    calls["n"] = 5
    assert m.value("trajstream_open_calls") == 5

    def broken() -> int:
        raise RuntimeError("table mid-rebalance")

    m.watch_open_calls(broken)
    value = m.value("trajstream_open_calls")
    assert value is not None and value != value  # NaN


def test_lag_replaces_the_previous_sample_and_skips_other_topics():
    m = Metrics(inputs=["p.agent-events"])
    m.consumer_lag({("p.agent-events", 0): 5, ("p.agent-events", 1): -2, ("p-x-changelog", 0): 9})
    assert m.value("trajstream_consumer_lag_records", topic="p.agent-events", partition="0") == 5
    assert m.value("trajstream_consumer_lag_records", topic="p.agent-events", partition="1") == 0
    assert m.value("trajstream_consumer_lag_records", topic="p-x-changelog", partition="0") is None
    m.consumer_lag({("p.agent-events", 1): 1})
    assert m.value("trajstream_consumer_lag_records", topic="p.agent-events", partition="0") is None


def test_lag_of_end_minus_committed():
    tps = [TP("a", 0), TP("a", 1), TP("a", 2), TP("a", 3)]
    ends = {TP("a", 0): 10, TP("a", 1): 4, TP("a", 2): None}
    committed = {TP("a", 0): 7}

    def end(tp: TP) -> int | None:
        if tp.partition == 3:
            raise AssertionError("partition is not assigned")  # aiokafka, mid-rebalance
        return ends[tp]

    assert lag_of(tps, end, committed.get) == {("a", 0): 3, ("a", 1): 4}


def test_readiness_needs_assigned_input_partitions_and_recovered_tables():
    m = Metrics(inputs=["p.agent-events", "p.ledger"])
    assert not m.ready
    m.partitions_revoked()
    m.partitions_assigned({TP("p.agent-events", 0), TP("p-pending-changelog", 0)})
    assert not m.ready and len(m.assigned) == 1
    m.tables_recovered()
    assert m.ready
    assert m.value("trajstream_ready") == 1
    assert m.value("trajstream_assigned_partitions") == 1
    m.partitions_revoked()
    assert not m.ready and m.value("trajstream_ready") == 0
    m.partitions_assigned([("p-x-__assignor-__leader", 0)])  # nothing of ours
    m.tables_recovered()
    assert not m.ready


def test_a_comparison_and_a_routing_change_are_exposed():
    from streams.models import RoutingShare
    from tests.unit.factories import comparison, sample_records

    m = Metrics(worker="w", app_id="a", clock=lambda: 100.0)
    m.comparison(comparison(agent_name="support", span="trailing"))
    m.comparison(comparison(agent_name="other", policy_mean=None, policy_count=1, difference=None))
    change = sample_records()[RoutingShare]
    assert isinstance(change, RoutingShare)
    m.routing(change)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.exposition().decode())
        for s in f.samples
        if s.name.startswith(("trajstream_compare", "trajstream_routing"))
    }
    assert (
        got[("trajstream_compare_difference", (("agent", "support"), ("span", "trailing")))] == 0.2
    )
    lower = ("trajstream_compare_difference_lower", (("agent", "support"), ("span", "trailing")))
    assert got[lower] == 0.12
    key = (
        "trajstream_compare_calls",
        (("agent", "support"), ("arm", "production"), ("span", "trailing")),
    )
    assert got[key] == 160
    nan = got[("trajstream_compare_difference", (("agent", "other"), ("span", "window")))]
    assert nan != nan  # NaN: no interval
    assert got[("trajstream_routing_share", (("agent", "researcher"),))] == 0.3
    changes = ("trajstream_routing_changes_total", (("action", "promote"), ("agent", "researcher")))
    assert got[changes] == 1


def test_the_stall_reason_is_what_health_and_the_exit_on_stall_say():
    now = [1000.0]
    position = [0]
    metrics = Metrics(inputs=["p.agent-events"], clock=lambda: now[0])
    metrics.watch_recovery(lambda: position[0], stall_s=300)
    metrics.watch_progress(stall_s=120)
    metrics.partitions_assigned([TP("p.agent-events", 0)])
    assert metrics.stall_reason() is None  # recovering, and moving
    now[0] += 300
    assert "recovery has read nothing for 300 s (observe.recovery_stall_s)" in str(
        metrics.stall_reason()
    )
    metrics.tables_recovered()
    metrics.consumption({("p.agent-events", 0): (40, 7)})
    assert metrics.stall_reason() is None
    now[0] += 120
    reason = str(metrics.stall_reason())
    assert "p.agent-events[0]: 33 records waiting at offset 7" in reason
    assert "observe.consumption_stall_s" in reason


def test_the_policys_fallbacks_and_version_are_exposed():
    from tests.unit.factories import comparison

    m = Metrics(worker="w", app_id="a", clock=lambda: 100.0)
    window = comparison(
        agent_name="support", policy_version=7, policy_fallbacks=3, policy_mixed=1,
        fallback_rate=0.1,
    )  # fmt: skip
    m.comparison(window)
    # one version's comparison of a window several answered sets the version only
    m.comparison(
        window.model_copy(update={"span": "version", "policy_version": 8, "policy_mean": 0.1})
    )
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(m.exposition().decode())
        for s in f.samples
        if s.name.startswith("trajstream_compare")
    }
    span = (("agent", "support"), ("span", "window"))
    assert got[("trajstream_compare_fallback_rate", span)] == 0.1
    calls = "trajstream_compare_calls"
    assert got[(calls, (("agent", "support"), ("arm", "fallback"), ("span", "window")))] == 3
    assert got[(calls, (("agent", "support"), ("arm", "mixed"), ("span", "window")))] == 1
    assert (
        got[("trajstream_compare_mean", (("agent", "support"), ("arm", "policy"), *span[1:]))]
        == 0.7
    )
    assert got[("trajstream_compare_policy_version", (("agent", "support"),))] == 8
    assert not any(labels and ("span", "version") in labels for _, labels in got)
