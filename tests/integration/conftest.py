"""Fixtures for tests that need real parts: a Kafka broker, the Trinity stand-in, workers.

The broker, chosen once per session, in this order:
1. ``KAFKA_BOOTSTRAP_SERVERS`` (or ``TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS``) is set: that cluster;
   ``PYTEST_TRAJSTREAM_BOOTSTRAP``: the broker the run's xdist controller started for its
   processes (``tests/conftest.py``);
2. a Docker engine answers: an official ``apache/kafka`` container (testcontainers);
3. otherwise the project's own launcher: official Kafka jars fetched with Maven, a single-node
   KRaft broker on a free loopback port, stopped at the end of the session.

Every test uses its own topic prefix and consumer group, so tests never see each other's data.
Workers run as real processes (``python -m streams.cli worker``; with a test-only hook,
``python -m tests.integration.faults worker``) and are killed at teardown,
also when the test fails; their logs are printed on failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from streams.codec import SchemaRegistry
from streams.devtools.broker import LocalBroker
from streams.devtools.standin import StandIn
from streams.models import AvroModel
from tests.conftest import SHARED_BOOTSTRAP

from . import faults

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("TRAJSTREAM_CACHE_DIR", REPO_ROOT / ".cache" / "trajstream"))
KAFKA_IMAGE = "apache/kafka:4.1.1"


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    configured = (
        os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        or os.environ.get("TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS")
        or os.environ.get(SHARED_BOOTSTRAP)  # the run's own broker, shared by its processes
    )
    if configured:
        yield configured
        return
    if _docker_engine():  # pragma: no cover - no Docker engine on the project's CI machine
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(KAFKA_IMAGE).with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    with LocalBroker(CACHE_DIR) as broker:
        yield broker.start(timeout=120)


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """A real schema registry (Apicurio Registry, in-memory, its Confluent-compatible API) on a
    free port for the session; its URL. Skips, saying why, where no Java 21+ is found."""
    from streams.devtools.registry import MIN_JAVA, LocalRegistry, find_java

    if find_java() is None:
        pytest.skip(
            f"the schema registry tests need Java {MIN_JAVA}+ ($JAVA_HOME, PATH, /usr/lib/jvm)"
        )
    with LocalRegistry(CACHE_DIR) as registry:
        yield registry.url


@pytest.fixture
def prefix() -> str:
    """A topic prefix and app id unique to this test."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def standin() -> AsyncIterator[StandIn]:
    server = StandIn()
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def production() -> AsyncIterator[StandIn]:
    """A second stand-in as the gateway's production upstream (its own model name)."""
    server = StandIn(model="production-model")
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.stop()


@dataclass
class WorkerProcess:
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> WorkerProcess:
        self.starts += 1
        fh = self.log.open("ab")
        fh.write(f"\n===== start {self.starts} =====\n".encode())
        fh.flush()
        # with a test-only hook asked for, the worker is started by tests/integration/faults.py
        entry = "tests.integration.faults" if faults.wanted(self.env) else "streams.cli"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", entry, "worker"],
            env=self.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        fh.close()
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, no final commit, nothing flushed."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM and wait (a graceful stop), SIGKILL if it hangs."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Workers:
    base_env: dict[str, str]
    tmp: Path
    started: list[WorkerProcess] = field(default_factory=list)

    def spawn(self, **settings: str) -> WorkerProcess:
        env = {**self.base_env, **settings}
        n = len(self.started)
        worker = WorkerProcess(env=env, log=self.tmp / f"worker-{n}.log")
        self.started.append(worker)
        return worker.start()

    def logs(self) -> str:
        """Each worker's warnings and errors (the last 40) and the end of its log."""
        out = []
        for w in self.started:
            if not w.log.exists():
                continue
            text = w.log.read_text(errors="replace")
            marked = [ln for ln in text.splitlines() if "[WARNING]" in ln or "[ERROR]" in ln]
            out.append(f"--- {w.log.name}: {len(marked)} warning(s) and error(s) ---")
            out.extend(ln[:300] for ln in marked[-40:])
            out.append(f"--- {w.log.name}: its end ---\n{text[-6000:]}")
        return "\n".join(out)


def base_env(bootstrap: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a worker process of one test: its broker, topic prefix and group."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    env.update(
        TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
        TRAJSTREAM_APP_ID=prefix,
        TRAJSTREAM_DATA_DIR=str(tmp_path / "data"),
        TRAJSTREAM_CACHE_DIR=str(CACHE_DIR),
        TRAJSTREAM_LOG_LEVEL="info",
        TRAJSTREAM_OBSERVE__PORT="0",  # workers share a host: a test that wants it picks a port
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def workers(
    request: pytest.FixtureRequest, kafka_bootstrap: str, prefix: str, tmp_path: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes with this test's settings: ``workers(TRAJSTREAM_X="y")``."""
    pool = Workers(base_env(kafka_bootstrap, prefix, tmp_path), tmp_path)

    def spawn(**settings: Any) -> WorkerProcess:
        return pool.spawn(**{k: str(v) for k, v in settings.items()})

    try:
        yield spawn
    finally:
        for w in pool.started:
            w.kill()
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(pool.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    until: Callable[[list[AvroModel]], bool] | None = None,
    timeout: float = 60.0,
    codec: SchemaRegistry | None = None,
) -> list[AvroModel]:
    """Every record on ``topic`` from the start, decoded; waits until ``until(records)``.

    A topic that does not exist holds no records (and is not created).
    """
    codec = codec or SchemaRegistry.default()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    records: list[AvroModel] = []
    deadline = time.monotonic() + timeout
    try:
        while topic not in await consumer.topics():
            if until is None or time.monotonic() > deadline:
                return records
            await asyncio.sleep(0.5)
        consumer.subscribe([topic])
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for msgs in batch.values():
                # a tombstone (no value: a deletion on a compacted topic) is no record
                records.extend(codec.decode(m.value) for m in msgs if m.value is not None)
            if until is None and not batch:
                break
            if until is not None and until(records):
                break
    finally:
        await consumer.stop()
    return records


async def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` (cheap, in-process) until true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


with suppress(ImportError):  # keep pytest's assertion rewriting for the helpers above
    pytest.register_assert_rewrite("tests.integration.conftest")


@asynccontextmanager
async def gateway_process(env: dict[str, str], log: Path) -> AsyncIterator[Any]:
    """``trajstream gateway`` as a process on a free port with ``env``, answering ``/healthz``;
    stopped on the way out (SIGTERM, then SIGKILL), also when the test fails. A test may kill
    it itself (``os.killpg(gw.proc.pid, signal.SIGKILL)``): the stop is then a no-op."""
    from .cluster_chaos import GatewayProcess

    gw = GatewayProcess(env, log).start()
    try:
        await gw.ready()
        yield gw
    finally:
        gw.stop()
