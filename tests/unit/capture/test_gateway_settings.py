"""The gateway's settings: required production URL, secret key never shown, routable strategy."""

from __future__ import annotations

import json

import pytest

from streams.capture.gateway import build_gateway
from streams.errors import ConfigError
from streams.settings import load_settings


def test_the_production_key_is_a_secret_everywhere_it_could_show(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__PRODUCTION_API_KEY", "sk-live-123")
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9"},
        gateway={"production_url": "https://api.example.com/v1/", "spill_dir": str(tmp_path)},
    )
    assert "sk-live-123" not in repr(settings)
    assert "sk-live-123" not in json.dumps(settings.model_dump(mode="json"))
    gateway = build_gateway(settings)  # reads the one settings object, copies none of it
    assert gateway.config is settings.gateway
    assert gateway.production_url == "https://api.example.com/v1"
    assert gateway._upstream("production", {})[1]["Authorization"] == "Bearer sk-live-123"
    assert "sk-live-123" not in repr(gateway.config)


def test_a_bad_key_value_is_named_but_not_echoed() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.production_api_key") as caught:
        load_settings(gateway={"production_api_key": 12345})
    assert "12345" not in str(caught.value)


def test_the_production_url_is_required_and_checked() -> None:
    with pytest.raises(ConfigError, match=r"gateway\.production_url"):
        build_gateway(load_settings(kafka={"bootstrap_servers": "127.0.0.1:9"}))
    with pytest.raises(ConfigError, match=r"gateway\.production_url"):
        load_settings(gateway={"production_url": "api.example.com"})
    with pytest.raises(ConfigError, match=r"gateway\.mode"):
        load_settings(gateway={"mode": "mirror"})


def test_a_strategy_that_cannot_route_stops_the_gateway_at_start(tmp_path) -> None:
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:1"},
        selection={"strategy": "per-model(m=sampling,*=marked)"},
        gateway={"production_url": "http://127.0.0.1:9/v1", "spill_dir": str(tmp_path)},
    )
    with pytest.raises(ConfigError, match="cannot route calls"):
        build_gateway(settings)


def test_the_policy_settings_reach_its_breaker_and_bad_ones_are_named(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__BREAKER__FAILURES", "7")
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__POLICY_TIMEOUT_S", "2.5")
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9"},
        gateway={
            "production_url": "http://127.0.0.1:9/v1",
            "spill_dir": str(tmp_path),
            "breaker": {"cooldown_s": 4, "probes": 2},
        },
    )
    policy = build_gateway(settings).policy
    assert policy.timeout_s == 2.5
    config = policy.breaker.config
    assert (config.failures, config.cooldown_s, config.probes) == (7, 4, 2)
    for bad, name in (
        ({"policy_timeout_s": 0}, r"gateway\.policy_timeout_s"),
        ({"policy_version_poll_s": -1}, r"gateway\.policy_version_poll_s"),
        ({"breaker": {"failure_rate": 1.5}}, r"gateway\.breaker\.failure_rate"),
        ({"breaker": {"probes": 0}}, r"gateway\.breaker\.probes"),
        ({"breaker": {"cooldown_s": 60, "max_cooldown_s": 30}}, r"gateway\.breaker"),
        ({"breaker": {"retries": 3}}, r"gateway\.breaker\.retries"),
    ):
        with pytest.raises(ConfigError, match=name):
            load_settings(gateway=bad)
