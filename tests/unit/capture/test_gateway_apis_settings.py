"""The settings of the gateway's Responses and Messages routes: Anthropic's URL checked and
without its trailing slash, its key a secret everywhere it could show, the routes mounted on
the gateway's application, the item store bounded by ``gateway.responses_calls``."""

from __future__ import annotations

import json

import pytest

from streams.capture.gateway import build_gateway
from streams.errors import ConfigError
from streams.settings import load_settings


def test_the_anthropic_key_is_a_secret_and_the_url_is_checked(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__ANTHROPIC_API_KEY", "sk-ant-live-9")
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9"},
        gateway={
            "production_url": "https://api.example.com/v1",
            "anthropic_url": "https://api.anthropic.com/",
            "spill_dir": str(tmp_path),
        },
    )
    assert "sk-ant-live-9" not in repr(settings)
    assert "sk-ant-live-9" not in json.dumps(settings.model_dump(mode="json"))
    assert settings.gateway.anthropic_url == "https://api.anthropic.com"
    apis = build_gateway(settings).apis
    url, headers = apis_production(apis)
    assert url == "https://api.anthropic.com/v1/messages"
    assert headers["x-api-key"] == "sk-ant-live-9"
    assert "sk-ant-live-9" not in repr(apis.config)
    with pytest.raises(ConfigError, match=r"gateway\.anthropic_url"):
        load_settings(gateway={"anthropic_url": "api.anthropic.com"})
    with pytest.raises(ConfigError, match=r"gateway\.responses_calls"):
        load_settings(gateway={"responses_calls": 0})


def apis_production(apis):
    """Where the Messages route sends a request production answers, and with what headers."""
    from streams.capture.gateway.api_shapes import Messages

    return Messages(apis, None).production({})  # type: ignore[arg-type]


def test_the_gateway_mounts_both_apis_with_and_without_a_call_id(tmp_path) -> None:
    settings = load_settings(
        kafka={"bootstrap_servers": "127.0.0.1:9"},
        gateway={
            "production_url": "https://api.example.com/v1",
            "anthropic_url": "https://api.anthropic.com",
            "responses_calls": 7,
            "spill_dir": str(tmp_path),
        },
    )
    gateway = build_gateway(settings)
    assert gateway.apis.config.anthropic_url == "https://api.anthropic.com"
    assert gateway.apis.items.max_calls == 7
    routes = {
        (r.method, r.resource.canonical)
        for r in gateway.app().router.routes()
        if r.resource is not None
    }
    for path in (
        "/v1/responses",
        "/calls/{call_id}/v1/responses",
        "/v1/messages",
        "/calls/{call_id}/v1/messages",
    ):
        assert ("POST", path) in routes
