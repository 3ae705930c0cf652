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
