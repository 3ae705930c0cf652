"""Client credentials: keys from the settings, the verdicts, the open-relay refusal."""

from __future__ import annotations

import json

import pytest

from streams.capture.auth import KeyRing, check_listen, is_loopback
from streams.errors import ConfigError
from streams.settings import load_settings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keys_come_as_json_objects_or_plain_strings_and_are_never_shown(monkeypatch) -> None:
    monkeypatch.setenv(
        "TRAJSTREAM_GATEWAY__API_KEYS",
        json.dumps([{"key": "sk-support-1", "agent": "support", "rate_per_s": 2}, "sk-plain-22"]),
    )
    keys = load_settings().gateway.api_keys
    assert [(k.agent, k.rate_per_s) for k in keys] == [("support", 2.0), (None, None)]
    settings = load_settings()
    shown = repr(settings) + json.dumps(settings.model_dump(mode="json"))
    assert "sk-support-1" not in shown and "sk-plain-22" not in shown
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__API_KEYS", "sk-plain-aa, sk-plain-bb")
    assert len(load_settings().gateway.api_keys) == 2


@pytest.mark.parametrize(
    "value",
    ['[{"key": "short"}]', '[{"key": "sk-123456789", "rate_per_s": 0}]', "[not json sk-1234567"],
)
def test_a_bad_key_is_named_and_not_echoed(monkeypatch, value: str) -> None:
    monkeypatch.setenv("TRAJSTREAM_GATEWAY__API_KEYS", value)
    with pytest.raises(ConfigError, match=r"gateway\.api_keys") as caught:
        load_settings()
    assert "sk-123456789" not in str(caught.value) and "short" not in str(caught.value)
    assert "sk-1234567" not in str(caught.value)


def test_the_same_key_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="twice"):
        load_settings(gateway={"api_keys": ["sk-aaaaaaaa", "sk-aaaaaaaa"]})


def test_verdicts_bearer_or_x_api_key_unknown_missing_and_the_rate() -> None:
    settings = load_settings(
        gateway={"api_keys": [{"key": "sk-support-1", "agent": "support", "rate_per_s": 2}]}
    )
    clock = Clock()
    ring = KeyRing(settings.gateway.api_keys, clock)
    assert ring.check({}).status == 401
    assert ring.check({"Authorization": "Bearer sk-other-1"}).status == 401
    assert ring.check({"Authorization": "Basic sk-support-1"}).status == 401
    ok = ring.check({"Authorization": "Bearer sk-support-1"})
    assert (ok.status, ok.agent) == (200, "support")
    assert ring.check({"x-api-key": "sk-support-1"}).status == 200  # the bucket holds 2
    limited = ring.check({"x-api-key": "sk-support-1"})
    assert limited.status == 429 and limited.retry_after_s == 1
    clock.now += 0.5  # one token back
    assert ring.check({"Authorization": "Bearer sk-support-1"}).status == 200
    assert ring.check({"Authorization": "Bearer sk-support-1"}).status == 429
    assert not KeyRing([])


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("localhost", True), ("::1", True), ("127.0.0.2", True),
     ("0.0.0.0", False), ("", False), ("10.0.0.5", False), ("gateway.internal", False)],
)  # fmt: skip
def test_without_keys_only_loopback_unless_anonymous_is_allowed(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    check_listen(host, has_keys=True, allow_anonymous=False)
    check_listen(host, has_keys=False, allow_anonymous=True)
    if loopback:
        check_listen(host, has_keys=False, allow_anonymous=False)
    else:
        with pytest.raises(ConfigError) as caught:
            check_listen(host, has_keys=False, allow_anonymous=False)
        line = str(caught.value)
        assert "gateway.api_keys" in line and "gateway.allow_anonymous" in line
        assert "\n" not in line
