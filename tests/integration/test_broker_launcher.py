"""Integration tests of streams.devtools.broker: fetch real Kafka jars, run real brokers, use them.

Each test starts its own broker on free ports, so none touches a broker the developer runs.
The jars are cached in ``$TRAJSTREAM_CACHE_DIR`` (default ``<repo>/.cache/trajstream``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.devtools.broker import (
    KAFKA_VERSION,
    LocalBroker,
    free_port,
    port_answers,
    start_detached,
    status,
    stop_detached,
)
from streams.errors import BrokerError

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("TRAJSTREAM_CACHE_DIR", REPO_ROOT / ".cache" / "trajstream"))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.long,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs java on PATH"),
]


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():  # a zombie is dead, whoever has to reap it
        try:
            return stat.read_text().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    LocalBroker(CACHE_DIR).fetch()
    return CACHE_DIR


async def test_produce_and_consume_one_record(cache_dir: Path, tmp_path: Path) -> None:
    broker = LocalBroker(cache_dir, data_dir=tmp_path / "kafka")
    bootstrap = await asyncio.to_thread(broker.start, 60)
    pid = broker.pid
    assert pid is not None
    assert bootstrap == broker.bootstrap_servers
    topic = f"test-broker-{uuid.uuid4().hex[:8]}"
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"hello", key=b"k1")
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"group-{topic}",
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            record = await asyncio.wait_for(consumer.getone(), timeout=30)
        finally:
            await consumer.stop()
        assert (record.key, record.value) == (b"k1", b"hello")
    finally:
        await asyncio.to_thread(broker.stop)

    assert broker.pid is None
    assert not pid_exists(pid)
    assert not port_answers("127.0.0.1", int(bootstrap.rpartition(":")[2]), timeout=0.5)
    assert (tmp_path / "kafka" / "kafka-logs" / "meta.properties").exists()  # data dir kept


def test_context_manager_uses_and_removes_a_temp_data_dir(cache_dir: Path) -> None:
    with LocalBroker(cache_dir) as broker:
        pid, data_dir = broker.pid, broker.data_dir
        assert pid is not None and data_dir is not None
        assert (data_dir / "server.properties").exists()
        assert port_answers(broker.host, broker.port or 0)
    assert not pid_exists(pid)
    assert not data_dir.exists()


def test_a_jvm_that_cannot_start_reports_its_output(cache_dir: Path) -> None:
    broker = LocalBroker(cache_dir, heap="1q")  # the JVM refuses this heap size
    with pytest.raises(BrokerError, match="storage failed") as excinfo:
        broker.start(timeout=30)
    assert "Invalid maximum heap size" in str(excinfo.value)
    assert broker.pid is None
    assert broker.data_dir is None  # the temp data dir is gone


def test_a_broker_that_exits_early_reports_its_log(cache_dir: Path, tmp_path: Path) -> None:
    # Storage that looks formatted but is not: format is skipped and Kafka itself fails.
    logs = tmp_path / "kafka" / "kafka-logs"
    logs.mkdir(parents=True)
    (logs / "meta.properties").write_text("version=1\nnode.id=7\n")
    broker = LocalBroker(cache_dir, data_dir=tmp_path / "kafka")
    with pytest.raises(BrokerError, match="exited with code") as excinfo:
        broker.start(timeout=60)
    assert "broker.log ---" in str(excinfo.value)
    assert broker.pid is None


def test_detached_broker_outlives_the_process_that_started_it(
    cache_dir: Path, tmp_path: Path
) -> None:
    # A cache dir of our own (so broker.json is ours) that shares the fetched jars.
    own_cache = tmp_path / "cache"
    own_cache.mkdir()
    (own_cache / f"kafka-{KAFKA_VERSION}").symlink_to(cache_dir / f"kafka-{KAFKA_VERSION}")
    port = free_port()
    script = (
        "import sys; from pathlib import Path; from streams.devtools.broker import start_detached; "
        "print(start_detached(Path(sys.argv[1]), port=int(sys.argv[2])).pid)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(own_cache), str(port)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    try:
        state = status(own_cache)
        assert state is not None
        assert (state.pid, state.bootstrap) == (pid, f"127.0.0.1:{port}")
        assert state.data_dir == own_cache / "data"
        assert start_detached(own_cache) == state  # idempotent: the live broker is returned
        assert stop_detached(own_cache) is True
    finally:
        if pid_exists(pid):  # never leave a broker behind, even when an assert failed
            os.killpg(pid, signal.SIGKILL)

    assert not pid_exists(pid)
    assert not port_answers("127.0.0.1", port, timeout=0.5)
    assert status(own_cache) is None
    assert stop_detached(own_cache) is False
    assert (own_cache / "data" / "kafka-logs" / "meta.properties").exists()


def test_trajstream_broker_start_brokers_3_serves_replicated_topics(
    cache_dir: Path, tmp_path: Path
) -> None:
    """The CLI's detached cluster: three nodes, `trajstream topics` with replication factor 3
    creates topics on all three with min.insync.replicas 2, and `broker stop` stops them all."""
    own_cache = tmp_path / "cache"
    own_cache.mkdir()
    (own_cache / f"kafka-{KAFKA_VERSION}").symlink_to(cache_dir / f"kafka-{KAFKA_VERSION}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAJSTREAM_", "KAFKA_"))}
    env.update(TRAJSTREAM_CACHE_DIR=str(own_cache), TRAJSTREAM_KAFKA__TOPIC_PREFIX="rf3")

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streams.cli", *args],
            cwd=REPO_ROOT,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    started = cli("broker", "start", "--brokers", "3", "--port", str(free_port()))
    assert started.returncode == 0, started.stderr
    state = status(own_cache)
    try:
        assert state is not None and len(state.nodes) == 3
        assert started.stdout.strip() == state.bootstrap_servers
        made = cli("topics", TRAJSTREAM_KAFKA__REPLICATION_FACTOR="3")
        assert made.returncode == 0, made.stderr

        async def describe() -> tuple[list[Any], Any]:
            from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

            admin = AIOKafkaAdminClient(bootstrap_servers=state.bootstrap_servers)
            await admin.start()
            try:
                topics = await admin.describe_topics(["rf3.agent-events"])
                configs = await admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, "rf3.agent-events")]
                )
                return topics, configs
            finally:
                await admin.close()

        topics, configs = asyncio.run(describe())
        assert all(len(p["replicas"]) == 3 for p in topics[0]["partitions"])
        entries = {c[0]: c[1] for c in configs[0].resources[0][4]}
        assert entries["min.insync.replicas"] == "2"
        status_line = cli("broker", "status")
        assert status_line.returncode == 0 and state.bootstrap_servers in status_line.stdout
        assert cli("broker", "stop").returncode == 0
        assert status(own_cache) is None
    finally:
        for node in state.nodes if state else ():
            if pid_exists(node.pid):
                os.killpg(node.pid, signal.SIGKILL)
