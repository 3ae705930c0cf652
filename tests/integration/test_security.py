"""Kafka over SASL_SSL and Trinity over https, on real servers.

A broker of its own (the project's launcher with ``sasl_ssl=True``: TLS with a CA made for the
test, PLAIN and SCRAM-SHA-256/512 users) serves every test here, so the first worker on it
meets a fresh cluster: that worker must start without an ERROR line. A wrong password and an
untrusted CA must stop each command at start with one line naming the setting (exit 2).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from streams.broker import LocalBroker, TlsFiles, write_certificates
from streams.devtools.traffic import simulate_call
from streams.errors import TrinityRejected, TrinityUnavailable
from streams.io.trinity import TrinityClient
from streams.sdk import TrajstreamProducer
from streams.settings import KafkaSecuritySettings, TrinitySettings
from streams.standin import StandIn
from streams.topics import Topics, create_topics

from .conftest import CACHE_DIR, REPO_ROOT, WorkerProcess, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.long]


@pytest.fixture(scope="module")
def secure_broker() -> Iterator[LocalBroker]:
    with LocalBroker(CACHE_DIR, sasl_ssl=True) as broker:
        yield broker


@pytest.fixture(scope="module")
def untrusted_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that did not sign the broker's certificate."""
    return write_certificates(tmp_path_factory.mktemp("other-ca")).ca_file


def security(broker: LocalBroker, mechanism: str, **changes: Any) -> dict[str, str]:
    """The kafka.security settings, as the environment variables a user would set."""
    values = {
        "PROTOCOL": "SASL_SSL",
        "MECHANISM": mechanism,
        "USERNAME": broker.sasl_username,
        "PASSWORD": broker.sasl_password,
        "SSL_CAFILE": str(broker.ca_file),
        **changes,
    }
    env = {f"TRAJSTREAM_KAFKA__SECURITY__{k}": v for k, v in values.items()}
    env["TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS"] = broker.sasl_ssl_bootstrap_servers
    return env


def as_settings(env: dict[str, str]) -> KafkaSecuritySettings:
    prefix = "TRAJSTREAM_KAFKA__SECURITY__"
    return KafkaSecuritySettings(
        **{k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(prefix)}
    )


def cli_env(prefix: str, tmp_path: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAJSTREAM_", "KAFKA_"))}
    env.update(
        TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
        TRAJSTREAM_APP_ID=prefix,
        TRAJSTREAM_DATA_DIR=str(tmp_path / "data"),
        TRAJSTREAM_CACHE_DIR=str(CACHE_DIR),
        TRAJSTREAM_OBSERVE__PORT="0",  # never the fixed default 9640: the host is shared
        PYTHONUNBUFFERED="1",
        **settings,
    )
    return env


def trajstream(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def prefix() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


# --- Kafka over SASL_SSL --------------------------------------------------------------------


async def test_scram_sha_512_worker_processes_a_call_and_starts_quietly(
    secure_broker: LocalBroker, prefix: str, tmp_path: Path
) -> None:
    env = security(secure_broker, "SCRAM-SHA-512")
    standin = StandIn()
    await standin.start("127.0.0.1", 0)
    worker = WorkerProcess(
        env=cli_env(
            prefix,
            tmp_path,
            **env,
            TRAJSTREAM_TRINITY__URL=standin.url,
            TRAJSTREAM_COMMIT__INTERVAL_S="1",
            TRAJSTREAM_LOG_LEVEL="info",
        ),
        log=tmp_path / "worker.log",
    )
    try:
        worker.start()
        await wait_for(
            lambda: "Worker ready" in worker.log.read_text(errors="replace") or not worker.alive,
            timeout=60,
            what="the worker to be ready",
        )
        assert worker.alive, worker.log.read_text()
        async with (
            TrajstreamProducer(
                env["TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS"],
                topic_prefix=prefix,
                security=as_settings(env),
            ) as producer,
            TrinityClient(standin.url) as trinity,
        ):
            sim = await simulate_call(producer, trinity, random.Random(1), agent="a", mark=True)
        await wait_for(
            lambda: set(standin.state.trained) >= set(sim.msg_ids) or not worker.alive,
            timeout=60,
            what="the call's feedback and commit at the stand-in",
        )
        log = worker.log.read_text(errors="replace")
        assert worker.alive, log
        assert [f.body["msg_ids"] for f in standin.state.feedback] == [sim.msg_ids]
        errors = [line for line in log.splitlines() if "[ERROR]" in line or " ERROR " in line]
        assert errors == [], "\n".join(errors)
        assert secure_broker.sasl_password not in log
    finally:
        worker.kill()
        await standin.stop()


async def test_plain_over_tls_produce_topics_and_replay(
    secure_broker: LocalBroker, prefix: str, tmp_path: Path
) -> None:
    env = cli_env(prefix, tmp_path, **security(secure_broker, "PLAIN"))

    topics = trajstream("topics", env=env)
    assert topics.returncode == 0, topics.stderr
    assert f"{prefix}.agent-events" in topics.stdout

    produced = trajstream("produce", str(REPO_ROOT / "examples" / "events.jsonl"), env=env)
    assert produced.returncode == 0, produced.stderr
    assert "published 6 event(s)" in produced.stdout

    # the SDK with SCRAM-SHA-256 on the same listener
    env256 = security(secure_broker, "SCRAM-SHA-256")
    async with TrajstreamProducer(
        env256["TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS"],
        topic_prefix=prefix,
        security=as_settings(env256),
    ) as producer:
        async with producer.call(agent_name="sdk-bot") as call:
            await call.tool("lookup", output="found")
            call.output = "done"

    replay = trajstream("replay", "--strategy", "sampling:1", "--lookback", "0", env=env)
    assert replay.returncode == 0, replay.stderr
    assert "selected" in replay.stdout and "2 of 2" in replay.stdout, replay.stdout

    # the status reader reaches the secured cluster too (its clients take kafka.security)
    status = trajstream("status", "--json", "--gap", "0", env=env)
    assert status.returncode in (0, 1), status.stderr  # 1: hints of errors (no worker runs)
    assert json.loads(status.stdout)["prefix"] == prefix, status.stdout


async def test_topics_admin_with_scram_creates_nothing_twice(
    secure_broker: LocalBroker, prefix: str
) -> None:
    env = security(secure_broker, "SCRAM-SHA-256")
    wanted = Topics(prefix, 2).all()
    bootstrap = env["TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS"]
    first = await create_topics(bootstrap, wanted, security=as_settings(env))
    again = await create_topics(bootstrap, wanted, security=as_settings(env))
    assert sorted(first) == sorted(wanted) and again == []


BAD_START = [
    ("worker",),
    ("topics",),
    ("produce", str(REPO_ROOT / "examples" / "events.jsonl")),
    ("replay",),
    ("gateway", "--production-url", "http://127.0.0.1:9/v1"),  # unreachable serves; this stops
]


@pytest.mark.parametrize("command", BAD_START, ids=lambda c: c[0])
def test_a_wrong_password_stops_each_command_with_one_line(
    secure_broker: LocalBroker, prefix: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    env = cli_env(prefix, tmp_path, **security(secure_broker, "SCRAM-SHA-512", PASSWORD="wrong"))
    started = time.monotonic()
    result = trajstream(*command, env=env, timeout=30)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "kafka.security.password [TRAJSTREAM_KAFKA__SECURITY__PASSWORD]" in lines[0]
    assert "wrong" not in lines[0]  # the secret is not echoed
    assert time.monotonic() - started < 20  # not a retry loop (a bound, not a timing target)


@pytest.mark.parametrize("command", BAD_START[:3], ids=lambda c: c[0])
def test_an_untrusted_certificate_stops_each_command_with_one_line(
    secure_broker: LocalBroker,
    untrusted_ca: Path,
    prefix: str,
    tmp_path: Path,
    command: tuple[str, ...],
) -> None:
    env = cli_env(
        prefix, tmp_path, **security(secure_broker, "PLAIN", SSL_CAFILE=str(untrusted_ca))
    )
    result = trajstream(*command, env=env, timeout=30)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "not trusted" in lines[0]
    assert "kafka.security.ssl_cafile [TRAJSTREAM_KAFKA__SECURITY__SSL_CAFILE]" in lines[0]


def test_plaintext_client_on_the_tls_listener_names_bootstrap_and_protocol(
    secure_broker: LocalBroker, prefix: str, tmp_path: Path
) -> None:
    env = cli_env(
        prefix,
        tmp_path,
        TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=secure_broker.sasl_ssl_bootstrap_servers,
    )
    result = trajstream("topics", env=env, timeout=30)
    assert result.returncode == 1, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "kafka.bootstrap_servers" in result.stderr
    assert "kafka.security.protocol" in result.stderr


# --- Trinity over https with a header ------------------------------------------------------


@pytest.fixture(scope="module")
def trinity_tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return write_certificates(tmp_path_factory.mktemp("trinity-tls"))


@pytest.fixture
async def https_trinity(trinity_tls: TlsFiles) -> AsyncIterator[tuple[str, list[str]]]:
    """An https server that answers the Trinity routes only with the right bearer token."""
    seen: list[str] = []

    async def commit(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer sesame":
            return web.json_response({"detail": "unauthorized"}, status=401)
        return web.json_response({"status": "success", "explore_step": 1})

    app = web.Application()
    app.router.add_post("/commit", commit)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(trinity_tls.cert_file, trinity_tls.key_file)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_trinity_over_https_with_a_ca_file_and_a_secret_header(
    https_trinity: tuple[str, list[str]], trinity_tls: TlsFiles, untrusted_ca: Path
) -> None:
    url, seen = https_trinity
    good = TrinitySettings(
        url=url, ca_file=trinity_tls.ca_file, headers={"Authorization": "Bearer sesame"}
    )
    async with TrinityClient.from_settings(good) as trinity:
        assert await trinity.commit() == {"status": "success", "explore_step": 1}
    assert seen == ["Bearer sesame"]

    no_header = TrinitySettings(url=url, ca_file=trinity_tls.ca_file)
    async with TrinityClient.from_settings(no_header) as trinity:
        with pytest.raises(TrinityRejected) as rejected:
            await trinity.commit()
    assert rejected.value.status == 401

    for ca in (None, untrusted_ca):  # the system's CAs, another CA: the server is not trusted
        untrusted = TrinitySettings(url=url, ca_file=ca, headers={"Authorization": "Bearer x"})
        async with TrinityClient.from_settings(untrusted) as trinity:
            not_trusted = r"certificate is not trusted .*trinity\.ca_file"
            with pytest.raises(TrinityUnavailable, match=not_trusted):
                await asyncio.wait_for(trinity.commit(), 10)
    assert seen == ["Bearer sesame", ""]  # the token never went to an unverified server
