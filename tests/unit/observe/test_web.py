"""The worker's HTTP server over real loopback HTTP (no Kafka needed)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from streams.errors import ConfigError
from streams.observe.metrics import Metrics
from streams.observe.web import ObserveServer, bind_socket
from streams.settings import load_settings


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


async def test_metrics_health_and_readiness():
    metrics = Metrics(inputs=["p.agent-events"])
    server = ObserveServer(metrics, "127.0.0.1", 0)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            assert (await client.get("/healthz")).status_code == 200
            not_ready = await client.get("/readyz")
            assert not_ready.status_code == 503
            assert not_ready.json() == {
                "ready": False,
                "assigned_partitions": 0,
                "tables_recovered": False,
            }
            metrics.partitions_assigned([TP("p.agent-events", 0), TP("p.agent-events", 1)])
            assert (await client.get("/readyz")).status_code == 503  # tables not recovered
            metrics.tables_recovered()
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["assigned_partitions"] == 2
            metrics.event_in("p.agent-events")
            scraped = await client.get("/metrics")
            assert scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert 'trajstream_events_in_total{topic="p.agent-events"} 1.0' in scraped.text
            assert (await client.get("/nothing")).status_code == 404
    finally:
        await server.stop()


def test_a_busy_port_fails_at_bind_naming_the_setting():
    taken = bind_socket("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=r"observe\.port \[TRAJSTREAM_OBSERVE__PORT\]"):
            ObserveServer(Metrics(), "127.0.0.1", port).bind()
    finally:
        taken.close()


def test_an_unknown_host_fails_naming_the_setting():
    with pytest.raises(ConfigError, match=r"observe\.host"):
        bind_socket("no-such-host.invalid", 0)


def test_observe_settings(monkeypatch):
    s = load_settings()
    assert (s.observe.host, s.observe.port, s.observe.lag_interval_s) == ("0.0.0.0", 9640, 10.0)
    monkeypatch.setenv("TRAJSTREAM_OBSERVE__PORT", "70000")
    with pytest.raises(ConfigError, match=r"observe\.port \[TRAJSTREAM_OBSERVE__PORT\]"):
        load_settings()


async def test_a_recovery_that_reads_nothing_for_the_limit_makes_the_worker_unhealthy():
    # the liveness probe's question: is a recovery running and stuck? (a stuck one is left to
    # a restart; a slow one that keeps reading is not)
    now = [1000.0]
    position = [0]
    metrics = Metrics(inputs=["p.agent-events"], clock=lambda: now[0])
    metrics.watch_recovery(lambda: position[0], stall_s=300)
    server = ObserveServer(metrics, "127.0.0.1", 0)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:

            async def health() -> httpx.Response:
                return await client.get("/healthz")

            now[0] += 1000  # nothing assigned yet (e.g. Kafka down): no recovery, alive
            assert (await health()).status_code == 200
            metrics.partitions_assigned([TP("p.agent-events", 0)])
            assert (await health()).status_code == 200  # the recovery's first sample
            now[0] += 299
            assert (await health()).status_code == 200
            position[0] = 7  # it read something: the limit counts from now
            now[0] += 1
            assert (await health()).status_code == 200
            now[0] += 299
            assert (await health()).status_code == 200
            scraped = (await client.get("/metrics")).text
            assert "trajstream_recovery_stalled_seconds 299.0" in scraped
            now[0] += 1
            stalled = await health()
            assert stalled.status_code == 503
            assert stalled.json()["status"] == "stalled"
            assert "for 300 s (observe.recovery_stall_s)" in stalled.json()["reason"]
            metrics.partitions_revoked()  # a rebalance: the next assignment starts afresh
            metrics.partitions_assigned([TP("p.agent-events", 1)])
            assert (await health()).status_code == 200
            now[0] += 400
            assert (await health()).status_code == 503
            metrics.tables_recovered()
            assert (await health()).status_code == 200
            assert "trajstream_recovery_stalled_seconds 0.0" in (await client.get("/metrics")).text
    finally:
        await server.stop()


async def test_health_is_503_while_a_watched_partition_makes_no_progress():
    now = [1000.0]
    metrics = Metrics(inputs=["p.agent-events"], clock=lambda: now[0])
    metrics.watch_progress(stall_s=120)
    metrics.partitions_assigned([TP("p.agent-events", 0)])
    metrics.tables_recovered()
    server = ObserveServer(metrics, "127.0.0.1", 0)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            metrics.consumption({("p.agent-events", 0): (40, 7)})
            now[0] += 119
            assert (await client.get("/healthz")).status_code == 200
            scraped = (await client.get("/metrics")).text
            line = 'trajstream_consumption_stalled_seconds{partition="0",topic="p.agent-events"}'
            assert f"{line} 119.0" in scraped
            now[0] += 1
            stalled = await client.get("/healthz")
            assert stalled.status_code == 503
            body = stalled.json()
            assert body["status"] == "stalled"
            assert "p.agent-events[0]: 33 records waiting at offset 7" in body["reason"]
            assert "observe.consumption_stall_s" in body["reason"]
            metrics.consumption({("p.agent-events", 0): (40, 8)})  # it moved
            assert (await client.get("/healthz")).status_code == 200
            now[0] += 500
            metrics.partitions_revoked()  # a rebalance: judged afresh after it
            assert (await client.get("/healthz")).status_code == 200
            assert line not in (await client.get("/metrics")).text
    finally:
        await server.stop()
