"""The gateway's own ``/metrics`` (Prometheus text format), one registry per gateway.

=============================================  =========  ======================================
``trajstream_gateway_overhead_seconds``        histogram  per answered request, the time spent in
                                                          the gateway apart from the upstream's
                                                          (labels ``route``: chat, stream)
``trajstream_gateway_requests_total``          counter    requests by ``outcome`` (answered,
                                                          rejected, unauthorized, rate_limited,
                                                          upstream_error, ack_timeout)
``trajstream_gateway_buffered_records``        gauge      records in memory for Kafka
``trajstream_gateway_spill_records``           gauge      records in the disk spill
``trajstream_gateway_spilled_records_total``   counter    records that went through the spill
``trajstream_gateway_published_records_total`` counter    records the broker acknowledged
``trajstream_gateway_kafka_up``                gauge      1 while the broker is reached
``trajstream_gateway_kafka_unreachable_seconds`` gauge    for how long it has not been (0: it is)
``trajstream_gateway_policy_fallbacks_total``  counter    requests of calls routed to the policy
                                                          that production answered, by ``reason``
                                                          and ``api`` (chat, responses, messages)
``trajstream_gateway_policy_breaker_state``    gauge      1 for the circuit breaker's state
                                                          (``state``: closed, half_open, open)
``trajstream_gateway_policy_breaker_transitions_total`` counter  changes of state, by ``to``
``trajstream_gateway_policy_stream_errors_total`` counter  the policy's streams that broke after
                                                          their first bytes reached the client
``trajstream_gateway_policy_version``          gauge      the policy's version (-1: not known)
``trajstream_gateway_shadow_failures_total``   counter    shadow mode: Trinity answers lost
=============================================  =========  ======================================

May import prometheus_client, :mod:`.breaker`, :mod:`.fallback`, and the gateway's state
(duck-typed); never a Kafka client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .breaker import CLOSED, HALF_OPEN, OPEN
from .fallback import REASONS

__all__ = ["APIS", "CONTENT_TYPE", "GatewayMetrics"]

APIS = ("chat", "responses", "messages")
"""The ``api`` label: the API the client spoke."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class _State(Collector):
    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        g = self.gateway
        stats, publisher = g.stats, g.publisher
        requests = CounterMetricFamily(
            "trajstream_gateway_requests", "requests by outcome", labels=["outcome"]
        )
        for outcome, value in (
            ("answered", sum(stats.answered.values())),
            ("rejected", stats.rejected),
            ("unauthorized", stats.unauthorized),
            ("rate_limited", stats.rate_limited),
            ("upstream_error", stats.upstream_errors),
            ("ack_timeout", stats.ack_timeouts),
        ):
            requests.add_metric([outcome], value)
        yield requests
        yield CounterMetricFamily(
            "trajstream_gateway_handover_timeouts",
            "buffered answers sent before their records reached the recorder's pipe "
            "(the recorder was gateway.ack_timeout_s behind reading it)",
            value=stats.handover_timeouts,
        )
        yield GaugeMetricFamily(
            "trajstream_gateway_buffered_records",
            "records in memory for Kafka",
            value=publisher.buffered,
        )
        yield GaugeMetricFamily(
            "trajstream_gateway_spill_records",
            "records in the disk spill",
            value=publisher.spill.records,
        )
        yield CounterMetricFamily(
            "trajstream_gateway_spilled_records",
            "records that went through the disk spill",
            value=publisher.stats.spilled,
        )
        yield CounterMetricFamily(
            "trajstream_gateway_published_records",
            "records the broker acknowledged",
            value=publisher.stats.published,
        )
        since = publisher.unreachable_since
        yield GaugeMetricFamily(
            "trajstream_gateway_kafka_up",
            "1 while the broker is reached",
            value=0 if since is not None or not publisher.stats.connected else 1,
        )
        yield GaugeMetricFamily(
            "trajstream_gateway_kafka_unreachable_seconds",
            "for how long the broker has not been reached (0: it is)",
            value=0.0 if since is None else time.monotonic() - since,
        )
        yield from self._policy(g.policy)
        yield CounterMetricFamily(
            "trajstream_gateway_shadow_failures",
            "shadow mode: requests whose copy Trinity did not answer (the step is recorded "
            "without Trinity's answer)",
            value=stats.shadow_failures,
        )

    def _policy(self, policy: Any) -> Iterator[Metric]:
        fallbacks = CounterMetricFamily(
            "trajstream_gateway_policy_fallbacks",
            "requests of calls routed to the policy that production answered, by why",
            labels=["reason", "api"],
        )
        counts = policy.fallbacks
        for reason in REASONS:  # every series from 0, so that rates start at the first one
            for api in APIS:
                fallbacks.add_metric([reason, api], counts.get((reason, api), 0))
        yield fallbacks
        state = GaugeMetricFamily(
            "trajstream_gateway_policy_breaker_state",
            "1 for the state the policy's circuit breaker is in",
            labels=["state"],
        )
        for name in (CLOSED, HALF_OPEN, OPEN):
            state.add_metric([name], 1 if policy.breaker.state == name else 0)
        yield state
        moves = CounterMetricFamily(
            "trajstream_gateway_policy_breaker_transitions",
            "the circuit breaker's changes of state, by the state it moved to",
            labels=["to"],
        )
        for name in (CLOSED, HALF_OPEN, OPEN):
            moves.add_metric([name], policy.transitions[name])
        yield moves
        yield CounterMetricFamily(
            "trajstream_gateway_policy_stream_errors",
            "the policy's streams that broke after their first bytes reached the client (the "
            "step is recorded with error_type)",
            value=policy.stream_errors,
        )
        version = policy.versions.current
        yield GaugeMetricFamily(
            "trajstream_gateway_policy_version",
            "the version of the policy's weights the gateway knows (-1: not known)",
            value=-1 if version is None else version,
        )


class GatewayMetrics:
    """The registry of one gateway: the overhead histogram and its state."""

    def __init__(self, gateway: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.overhead = Histogram(
            "trajstream_gateway_overhead_seconds",
            "time a request spent in the gateway apart from the upstream's",
            ["route"],
            buckets=OVERHEAD_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_State(gateway))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
