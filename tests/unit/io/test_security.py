"""Unit tests of the kafka.security settings and of streams.io.security's builders."""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path
from typing import Any

import faust
import pytest

from streams import settings as settings_module
from streams.broker import free_port, write_certificates
from streams.cli import main
from streams.errors import BrokerError, ConfigError
from streams.io.security import check_kafka, faust_credentials, kafka_client_kwargs, ssl_context
from streams.settings import KafkaSecuritySettings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(os.environ):
        if key.startswith("TRAJSTREAM_") or key == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(key)
    monkeypatch.setattr(settings_module, "_CONFIG_FILE", {})
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return write_certificates(tmp_path_factory.mktemp("tls"))


def sasl(**kw: Any) -> dict[str, Any]:
    return {
        "protocol": "SASL_SSL",
        "mechanism": "SCRAM-SHA-512",
        "username": "alice",
        "password": "s3cret-pw",
        **kw,
    }


# --- settings ------------------------------------------------------------------------------


def test_default_is_plaintext() -> None:
    s = load_settings().kafka.security
    assert (s.protocol, s.mechanism, s.username, s.password) == ("PLAINTEXT", None, None, None)
    assert s.ssl_check_hostname is True
    assert kafka_client_kwargs(s) == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(s) is None


@pytest.mark.parametrize(
    ("security", "named"),
    [
        (
            {"protocol": "SASL_SSL"},
            "kafka.security.mechanism [TRAJSTREAM_KAFKA__SECURITY__MECHANISM]",
        ),
        (sasl(username=None), "kafka.security.username [TRAJSTREAM_KAFKA__SECURITY__USERNAME]"),
        (sasl(password=None), "kafka.security.password [TRAJSTREAM_KAFKA__SECURITY__PASSWORD]"),
        (sasl(password=""), "kafka.security.password"),
        (sasl(mechanism="OAUTHBEARER"), "kafka.security.mechanism"),
        (sasl(mechanism="GSSAPI"), "kafka.security.mechanism"),
        ({"protocol": "PLAINTEXT", "mechanism": "PLAIN"}, "kafka.security.mechanism"),
        ({"protocol": "TLS"}, "kafka.security.protocol"),
        (sasl(ssl_cafile="missing-ca.pem"), "kafka.security.ssl_cafile"),
        (sasl(ssl_certfile="missing-cert.pem"), "kafka.security.ssl_certfile"),
        ({"protocol": "PLAINTEXT", "ssl_cafile": "/etc/hostname"}, "kafka.security.ssl_cafile"),
    ],
)
def test_bad_security_fails_naming_the_setting(security: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=r"bad setting " + named.replace("[", r"\[")):
        load_settings(kafka={"security": security})


def test_a_key_without_a_certificate_is_an_error(tls: Any) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.security.ssl_keyfile.*ssl_certfile"):
        load_settings(kafka={"security": {"protocol": "SSL", "ssl_keyfile": str(tls.key_file)}})


def test_a_missing_file_is_named_with_its_path() -> None:
    with pytest.raises(ConfigError, match=r"no such file: nowhere/ca\.pem"):
        load_settings(kafka={"security": sasl(ssl_cafile="nowhere/ca.pem")})


def test_security_from_the_environment(monkeypatch: pytest.MonkeyPatch, tls: Any) -> None:
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SECURITY__PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SECURITY__MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SECURITY__USERNAME", "svc")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SECURITY__PASSWORD", "from-env")
    monkeypatch.setenv("TRAJSTREAM_KAFKA__SECURITY__SSL_CAFILE", str(tls.ca_file))
    s = load_settings().kafka.security
    assert s.mechanism == "SCRAM-SHA-256" and s.password is not None
    assert s.password.get_secret_value() == "from-env"
    assert s.ssl_cafile == tls.ca_file


def test_a_bad_secret_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(kafka={"security": sasl(password=12345)})
    assert "12345" not in str(info.value)


def test_secrets_are_masked_in_settings_and_repr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tls: Any
) -> None:
    config = tmp_path / "prod.toml"
    config.write_text(
        f"""
[kafka.security]
protocol = "SASL_SSL"
mechanism = "PLAIN"
username = "svc"
password = "kafka-pw-123"
ssl_cafile = "{tls.ca_file}"
ssl_key_password = "key-pw-456"

[trinity]
url = "https://trinity.example:8443"
ca_file = "{tls.ca_file}"
headers = {{ Authorization = "Bearer token-789" }}
"""
    )
    assert main(["--config", str(config), "settings"]) == 0
    out = capsys.readouterr().out
    for secret in ("kafka-pw-123", "key-pw-456", "token-789"):
        assert secret not in out
    shown = json.loads(out)
    assert shown["kafka"]["security"]["password"] == "**********"
    assert shown["kafka"]["security"]["username"] == "svc"
    assert shown["trinity"]["headers"] == {"Authorization": "**********"}
    settings = load_settings(config)
    assert "kafka-pw-123" not in repr(settings) and "token-789" not in repr(settings)


# --- builders ------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_kwargs(mechanism: str, tls: Any) -> None:
    s = KafkaSecuritySettings(**sasl(mechanism=mechanism, ssl_cafile=tls.ca_file))
    kwargs = kafka_client_kwargs(s)
    context = kwargs.pop("ssl_context")
    assert kwargs == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
        "sasl_plain_password": "s3cret-pw",
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.check_hostname is True and context.verify_mode == ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1  # the CA file only, not the system's


def test_sasl_plaintext_has_no_tls_context() -> None:
    s = KafkaSecuritySettings(**sasl(protocol="SASL_PLAINTEXT"))
    kwargs = kafka_client_kwargs(s)
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT" and "ssl_context" not in kwargs
    creds = faust_credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.protocol.value == "SASL_PLAINTEXT"


def test_hostname_check_can_be_turned_off_but_the_chain_is_still_verified(tls: Any) -> None:
    s = KafkaSecuritySettings(protocol="SSL", ssl_cafile=tls.ca_file, ssl_check_hostname=False)
    context = ssl_context(s)
    assert context is not None
    assert context.check_hostname is False and context.verify_mode == ssl.CERT_REQUIRED


def test_client_certificate_is_loaded(tls: Any) -> None:
    s = KafkaSecuritySettings(
        protocol="SSL",
        ssl_cafile=tls.ca_file,
        ssl_certfile=tls.cert_file,
        ssl_keyfile=tls.key_file,
    )
    assert kafka_client_kwargs(s)["security_protocol"] == "SSL"
    creds = faust_credentials(s)
    assert isinstance(creds, faust.SSLCredentials)


def test_a_file_that_is_not_a_certificate_is_a_config_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    s = KafkaSecuritySettings(protocol="SSL", ssl_cafile=junk)
    with pytest.raises(ConfigError, match=r"kafka\.security.ssl_cafile"):
        ssl_context(s)


def test_faust_credentials_reach_aiokafka_with_scram(tls: Any) -> None:
    """What faust's aiokafka driver passes to its consumer and producer."""
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    s = KafkaSecuritySettings(**sasl(ssl_cafile=tls.ca_file))
    auth = credentials_to_aiokafka_auth(faust_credentials(s))
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert auth["sasl_plain_username"] == "alice"
    assert auth["sasl_plain_password"] == "s3cret-pw"
    assert isinstance(auth["ssl_context"], ssl.SSLContext)
    assert "s3cret-pw" not in repr(faust_credentials(s))


def test_a_key_that_does_not_match_the_certificate_names_the_key(tls: Any, tmp_path: Path) -> None:
    other = write_certificates(tmp_path / "other")
    s = KafkaSecuritySettings(
        protocol="SSL", ssl_certfile=tls.cert_file, ssl_keyfile=other.key_file
    )
    with pytest.raises(ConfigError, match=r"kafka\.security.ssl_keyfile"):
        ssl_context(s)


async def test_check_names_the_bootstrap_servers_when_nothing_answers() -> None:
    port = free_port()
    with pytest.raises(BrokerError, match=r"kafka\.bootstrap_servers.*kafka\.security\.protocol"):
        await check_kafka(f"127.0.0.1:{port}", KafkaSecuritySettings(), timeout_s=2)


async def test_check_rejects_a_bootstrap_server_without_a_port() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_servers.*'broker-1'"):
        await check_kafka("broker-1", KafkaSecuritySettings(), timeout_s=2)
