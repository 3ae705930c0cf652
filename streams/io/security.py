"""Kafka security: the ``kafka.security`` settings turned into what each client library takes.

One place builds the TLS context and the SASL options of every Kafka client trajstream makes:
:func:`kafka_client_kwargs` for aiokafka clients (producer, consumer, admin: the SDK,
``produce``, ``replay``, ``topics``), :func:`faust_credentials` for the workers'
``faust.App(broker_credentials=...)`` (faust hands them to the same aiokafka options, see
``faust.transport.drivers.aiokafka.credentials_to_aiokafka_auth``), and
:func:`check_kafka`, the start-up check that turns a wrong password, an untrusted certificate
or an unreachable cluster into one :class:`~streams.errors.ConfigError` or
:class:`~streams.errors.BrokerError` line naming the setting, instead of a client retrying
forever. Secrets are read from their ``SecretStr`` only here, and never logged.

May import: the standard library, aiokafka, faust (lazily), streams.settings, streams.errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context

from streams.errors import BrokerError, ConfigError
from streams.settings import KafkaSecuritySettings

__all__ = ["check_kafka", "faust_credentials", "kafka_client_kwargs", "ssl_context"]

_ENV = "TRAJSTREAM_KAFKA__SECURITY__"


def ssl_context(security: KafkaSecuritySettings) -> ssl.SSLContext | None:
    """The client TLS context of an SSL or SASL_SSL protocol, else None.

    Trusts ``ssl_cafile`` (or the system's CAs when unset), presents ``ssl_certfile`` and
    ``ssl_keyfile`` when set, and checks the broker's host name unless
    ``ssl_check_hostname`` is false (the certificate chain is verified either way).
    """
    if not security.uses_tls:
        return None
    try:
        context = create_ssl_context(cafile=security.ssl_cafile)
    except (OSError, ssl.SSLError) as exc:
        raise _unloadable("ssl_cafile", exc) from exc
    if security.ssl_certfile is not None:
        password = security.ssl_key_password
        try:
            context.load_cert_chain(
                security.ssl_certfile,
                security.ssl_keyfile,
                password.get_secret_value() if password is not None else None,
            )
        except (OSError, ssl.SSLError) as exc:
            text = str(exc).lower()
            name = "ssl_certfile"
            if "key" in text or "pem lib" in text:
                name = "ssl_key_password" if password is not None else "ssl_keyfile"
            raise _unloadable(name, exc) from exc
    context.check_hostname = security.ssl_check_hostname
    return context


def _unloadable(name: str, exc: Exception) -> ConfigError:
    return ConfigError(f"bad setting {_setting(name)}: cannot load it: {exc}")


def kafka_client_kwargs(security: KafkaSecuritySettings) -> dict[str, Any]:
    """The keyword arguments that give an aiokafka client these security settings.

    >>> kafka_client_kwargs(KafkaSecuritySettings())
    {'security_protocol': 'PLAINTEXT'}
    """
    kwargs: dict[str, Any] = {"security_protocol": security.protocol}
    context = ssl_context(security)
    if context is not None:
        kwargs["ssl_context"] = context
    if security.uses_sasl:
        assert security.password is not None  # the settings require it with SASL
        kwargs["sasl_mechanism"] = security.mechanism
        kwargs["sasl_plain_username"] = security.username
        kwargs["sasl_plain_password"] = security.password.get_secret_value()
    return kwargs


def faust_credentials(security: KafkaSecuritySettings) -> Any:
    """``broker_credentials`` for ``faust.App``: None for PLAINTEXT.

    SSL gives ``faust.SSLCredentials``; SASL_PLAINTEXT and SASL_SSL give
    ``faust.SASLCredentials`` with the mechanism (PLAIN or SCRAM-SHA-256/512), which faust
    passes on to aiokafka's ``sasl_*`` options unchanged.
    """
    import faust

    context = ssl_context(security)
    if not security.uses_sasl:
        return faust.SSLCredentials(context) if context is not None else None
    assert security.password is not None
    return faust.SASLCredentials(
        username=security.username,
        password=security.password.get_secret_value(),
        ssl_context=context,
        mechanism=security.mechanism,
    )


def _setting(name: str) -> str:
    if name == "bootstrap_servers":
        return "kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS]"
    return f"kafka.security.{name} [{_ENV}{name.upper()}]"


async def check_kafka(
    bootstrap: str, security: KafkaSecuritySettings, *, timeout_s: float = 10.0
) -> None:
    """Connect to the first answering bootstrap server and authenticate, once, within
    ``timeout_s``; raise one clear error naming the setting to fix.

    Wrong credentials or an untrusted certificate are :class:`ConfigError` (retrying cannot
    help); no server answering is :class:`BrokerError` naming ``kafka.bootstrap_servers``.
    """
    kwargs = kafka_client_kwargs(security)
    hosts = [h.strip() for h in bootstrap.split(",") if h.strip()]
    problems: list[str] = []
    for hostport in hosts:
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"bad setting {_setting('bootstrap_servers')}: {hostport!r} is not host:port"
            )
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host.strip("[]"),
                    int(port),
                    client_id="trajstream-check",
                    request_timeout_ms=int(timeout_s * 1000),
                    **kwargs,
                ),
                timeout_s,
            )
        except SaslAuthenticationFailed as exc:
            raise ConfigError(
                f"Kafka at {hostport} refused the credentials of {security.mechanism} user "
                f"{security.username!r}: check {_setting('password')} and "
                f"{_setting('username')} ({exc})"
            ) from exc
        except UnsupportedSaslMechanismError as exc:
            raise ConfigError(
                f"Kafka at {hostport} does not offer SASL mechanism {security.mechanism}: "
                f"check {_setting('mechanism')} ({exc})"
            ) from exc
        except ssl.SSLCertVerificationError as exc:
            if "hostname" in (exc.verify_message or "").lower() or "match" in str(exc):
                raise ConfigError(
                    f"the certificate of Kafka at {hostport} is not valid for {host}: "
                    f"{exc.verify_message}; connect by a name it has, or set "
                    f"{_setting('ssl_check_hostname')} false"
                ) from exc
            raise ConfigError(
                f"the certificate of Kafka at {hostport} is not trusted "
                f"({exc.verify_message}): check {_setting('ssl_cafile')}"
            ) from exc
        except ssl.SSLError as exc:
            raise ConfigError(
                f"TLS with Kafka at {hostport} failed ({exc.reason or exc}): does the listener "
                f"speak {security.protocol}? check {_setting('protocol')}"
            ) from exc
        except TimeoutError:
            problems.append(
                f"{hostport}: no answer within {timeout_s:g}s (is {_setting('protocol')}="
                f"{security.protocol} what this listener speaks?)"
            )
        except (OSError, KafkaError) as exc:
            problems.append(f"{hostport}: {type(exc).__name__}: {exc}")
        else:
            with contextlib.suppress(Exception):
                conn.close()
            return
    raise BrokerError(
        f"cannot reach Kafka at {bootstrap} ({'; '.join(problems)}): check "
        f"{_setting('bootstrap_servers')} and {_setting('protocol')}={security.protocol}"
    )
