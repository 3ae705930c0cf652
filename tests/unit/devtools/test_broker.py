"""Unit tests of streams.devtools.broker's pure parts: rendering, ports, executables, state files.

Nothing here starts a JVM or runs Maven; ``tests/integration/test_broker_launcher.py`` does.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from streams.devtools.broker import (
    KAFKA_VERSION,
    BrokerState,
    LocalBroker,
    free_port,
    new_cluster_id,
    port_answers,
    port_is_free,
    render_log4j2_config,
    render_pom,
    render_server_properties,
    require_executable,
    status,
    stop_detached,
)
from streams.devtools.broker import process as process_module
from streams.errors import BrokerError

POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def parse_properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything tries to run Maven or Java."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"unexpected subprocess: {args!r}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


def hide_executable(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    real_which = shutil.which

    def which(name: str, *args: Any, **kwargs: Any) -> str | None:
        return None if name == missing else real_which(name, *args, **kwargs)

    monkeypatch.setattr(shutil, "which", which)


# --- rendering --------------------------------------------------------------------------


def test_server_properties_has_the_required_keys_and_ports(tmp_path: Path) -> None:
    props = parse_properties(
        render_server_properties(
            host="127.0.0.1", port=40001, controller_port=40002, log_dir=tmp_path / "logs"
        )
    )

    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:40002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:40001,CONTROLLER://127.0.0.1:40002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:40001"
    assert props["controller.listener.names"] == "CONTROLLER"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert props["log.dirs"] == (tmp_path / "logs").as_posix()
    assert props["auto.create.topics.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["num.partitions"] == "1"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert props[key] == "1", key


def test_server_properties_never_sets_standalone_style_bootstrap(tmp_path: Path) -> None:
    # controller.quorum.voters is a static quorum; mixing in the dynamic-quorum setting
    # makes the storage tool refuse to format.
    text = render_server_properties(host="127.0.0.1", port=1, controller_port=2, log_dir=tmp_path)
    assert "controller.quorum.bootstrap.servers" not in text


def test_pom_pins_the_kafka_version() -> None:
    root = ET.fromstring(render_pom())
    deps = {
        (
            d.findtext("m:groupId", namespaces=POM_NS),
            d.findtext("m:artifactId", namespaces=POM_NS),
        ): d.findtext("m:version", namespaces=POM_NS)
        for d in root.iterfind("m:dependencies/m:dependency", POM_NS)
    }
    assert deps[("org.apache.kafka", "kafka_2.13")] == KAFKA_VERSION == "4.1.1"
    assert deps[("org.apache.logging.log4j", "log4j-core")]
    assert deps[("org.slf4j", "slf4j-api")]
    assert root.findtext("m:packaging", namespaces=POM_NS) == "pom"


def test_pom_renders_another_version() -> None:
    assert "<version>9.9.9</version>" in render_pom("9.9.9")


def test_log4j2_config_logs_warn_to_the_file_named_by_a_system_property() -> None:
    props = parse_properties(render_log4j2_config())
    assert props["rootLogger.level"] == "warn"
    assert props["appender.file.fileName"] == "${sys:trajstream.broker.log}"


def test_cluster_id_is_a_kafka_style_uuid() -> None:
    for _ in range(50):
        cluster_id = new_cluster_id()
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


# --- ports ------------------------------------------------------------------------------


def test_free_port_is_bindable_and_taken_port_is_not() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    assert port_is_free("127.0.0.1", port)
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert not port_is_free("127.0.0.1", port)
        assert port_answers("127.0.0.1", port)
    assert not port_answers("127.0.0.1", port, timeout=0.5)


def test_free_ports_are_distinct() -> None:
    ports = process_module.free_ports("127.0.0.1", 5)
    assert len(set(ports)) == 5


def test_free_ports_are_chosen_below_the_ephemeral_range() -> None:
    """Where the OS takes ports for outgoing connections and binds to port 0, another process
    could take a chosen port before the broker binds it."""
    ephemeral = process_module.ephemeral_range()
    if process_module.chosen_port_range(ephemeral) is None:
        pytest.skip(f"no room below this machine's ephemeral port range {ephemeral}")
    assert ephemeral is not None
    ports = process_module.free_ports("127.0.0.1", 20)
    assert len(set(ports)) == 20
    assert all(process_module.LOWEST_CHOSEN_PORT <= p < ephemeral[0] for p in ports)
    with socket.socket() as other:  # what any other process gets from the OS
        other.bind(("127.0.0.1", 0))
        assert other.getsockname()[1] >= ephemeral[0]


def test_ephemeral_range_read_from_the_os_file(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert process_module.ephemeral_range(ranges) == (32768, 60999)
    ranges.write_text("garbage\n")
    assert process_module.ephemeral_range(ranges) is None
    assert process_module.ephemeral_range(tmp_path / "absent") is None


def test_free_ports_let_the_os_choose_without_room_below_the_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_module, "ephemeral_range", lambda: (10_200, 60_999))
    ports = process_module.free_ports("127.0.0.1", 3)
    assert len(set(ports)) == 3
    assert all(port_is_free("127.0.0.1", p) for p in ports)


def test_free_ports_fall_back_to_the_os_when_the_candidates_are_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        # the only candidate is taken: every try fails, then the OS chooses
        monkeypatch.setattr(process_module, "chosen_port_range", lambda _: range(taken, taken + 1))
        ports = process_module.free_ports("127.0.0.1", 2)
    assert taken not in ports
    assert len(set(ports)) == 2


# --- executables ------------------------------------------------------------------------


def test_require_executable_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_executable(monkeypatch, "java")
    with pytest.raises(BrokerError, match=r"'java'.*Java 17"):
        require_executable("java")


def test_start_without_java_raises_before_fetching(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_subprocess: None
) -> None:
    hide_executable(monkeypatch, "java")
    broker = LocalBroker(tmp_path / "cache")
    with pytest.raises(BrokerError, match="java"):
        broker.start()
    assert broker.pid is None
    assert not (tmp_path / "cache").exists()


def test_fetch_without_maven_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_subprocess: None
) -> None:
    hide_executable(monkeypatch, "mvn")
    with pytest.raises(BrokerError, match="mvn"):
        LocalBroker(tmp_path).fetch()


def test_fetch_is_skipped_when_the_marker_exists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_subprocess: None
) -> None:
    hide_executable(monkeypatch, "mvn")  # proves Maven is not needed
    broker = LocalBroker(tmp_path)
    broker.kafka_dir.mkdir(parents=True)
    (broker.kafka_dir / ".fetched").write_text("kafka_2.13-4.1.1.jar\n")

    assert broker.fetch() == tmp_path.absolute() / f"kafka-{KAFKA_VERSION}" / "libs"
    assert broker.log4j2_config.read_text() == render_log4j2_config()


def test_start_on_a_taken_port_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_subprocess: None
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
    monkeypatch.setattr(LocalBroker, "fetch", lambda self: self.libs_dir)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        broker = LocalBroker(tmp_path, data_dir=tmp_path / "data", port=port)
        with pytest.raises(BrokerError, match=f"port 127.0.0.1:{port} is already in use"):
            broker.start()


# --- LocalBroker before start -----------------------------------------------------------


def test_bootstrap_servers_is_known_only_with_a_port(tmp_path: Path) -> None:
    assert LocalBroker(tmp_path, port=19999).bootstrap_servers == "127.0.0.1:19999"
    with pytest.raises(BrokerError, match="start"):
        _ = LocalBroker(tmp_path).bootstrap_servers


def test_unstarted_broker_has_no_pid_and_stop_is_harmless(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path)
    assert broker.pid is None
    assert broker.data_dir is None
    broker.stop()
    assert LocalBroker(tmp_path, data_dir=tmp_path / "d").log_file == (
        tmp_path.absolute() / "d" / "broker.log"
    )


async def test_run_coroutine_works_inside_a_running_loop() -> None:
    async def answer() -> int:
        return 42

    assert process_module.run_coroutine(answer) == 42


# --- detached state ---------------------------------------------------------------------


def make_state(tmp_path: Path, pid: int) -> BrokerState:
    data = tmp_path / "data"
    return BrokerState(
        pid=pid,
        bootstrap="127.0.0.1:9092",
        data_dir=data,
        log_file=data / "broker.log",
        stdout_file=data / "broker.out",
        config_file=data / "server.properties",
        kafka_version=KAFKA_VERSION,
        started_at="2025-01-01T00:00:00+00:00",
    )


def test_broker_state_round_trips_through_json(tmp_path: Path) -> None:
    state = make_state(tmp_path, 1234)
    assert BrokerState.from_json(state.to_json()) == state
    assert json.loads(state.to_json())["data_dir"] == str(tmp_path / "data")
    assert (state.host, state.port) == ("127.0.0.1", 9092)


def test_status_is_none_without_a_state_file(tmp_path: Path) -> None:
    assert status(tmp_path) is None
    assert stop_detached(tmp_path) is False


def test_a_recorded_pid_that_is_not_a_broker_is_never_signalled(tmp_path: Path) -> None:
    # Our own pid is alive but is not a Kafka broker: a reused pid must not be killed.
    (tmp_path / "broker.json").write_text(make_state(tmp_path, os.getpid()).to_json())
    assert status(tmp_path) is None
    assert stop_detached(tmp_path) is False
    assert not (tmp_path / "broker.json").exists()


def test_an_unreadable_state_file_counts_as_no_broker(tmp_path: Path) -> None:
    (tmp_path / "broker.json").write_text("{not json")
    assert status(tmp_path) is None


def test_sasl_ssl_listener_is_added_beside_plaintext(tmp_path: Path) -> None:
    keystore = tmp_path / "server-keystore.pem"
    props = parse_properties(
        render_server_properties(
            host="127.0.0.1",
            port=40001,
            controller_port=40002,
            log_dir=tmp_path / "logs",
            sasl_ssl=(40003, keystore, "alice", "pw123"),
        )
    )
    assert props["listeners"] == (
        "PLAINTEXT://127.0.0.1:40001,CONTROLLER://127.0.0.1:40002,SASL_SSL://127.0.0.1:40003"
    )
    assert props["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:40001,SASL_SSL://127.0.0.1:40003"
    )
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["listener.security.protocol.map"].endswith(",SASL_SSL:SASL_SSL")
    assert props["sasl.enabled.mechanisms"] == "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    assert props["listener.name.sasl_ssl.ssl.keystore.type"] == "PEM"
    assert props["listener.name.sasl_ssl.ssl.keystore.location"] == keystore.as_posix()
    assert 'user_alice="pw123";' in props["listener.name.sasl_ssl.plain.sasl.jaas.config"]


def test_certificates_name_the_hosts_and_chain_to_the_ca(tmp_path: Path) -> None:
    import ssl

    from cryptography import x509

    from streams.broker import write_certificates

    files = write_certificates(tmp_path, hosts=("127.0.0.1", "localhost"))
    cert = x509.load_pem_x509_certificate(files.cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.cert_file, files.key_file)  # key and certificate match
    keystore = files.keystore.read_text()
    assert keystore.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8, as Kafka's PEM wants
    assert keystore.count("BEGIN CERTIFICATE") == 2
    assert oct(files.keystore.stat().st_mode & 0o777) == "0o600"


# --- a cluster of N -----------------------------------------------------------------------


def test_a_cluster_node_lists_every_voter_and_replicates_internal_topics_three_times(
    tmp_path: Path,
) -> None:
    from streams.devtools.broker.config import NodeAddress, voters_of

    nodes = [NodeAddress(i, 41000 + 2 * i, 41001 + 2 * i) for i in (1, 2, 3)]
    voters = voters_of("127.0.0.1", nodes)
    props = parse_properties(
        render_server_properties(
            host="127.0.0.1",
            port=41004,
            controller_port=41005,
            log_dir=tmp_path,
            node_id=2,
            voters=voters,
            cluster_size=3,
        )
    )
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:41003,2@127.0.0.1:41005,3@127.0.0.1:41007"
    )
    assert props["node.id"] == "2" and props["process.roles"] == "broker,controller"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["default.replication.factor"] == "3"
    assert props["unclean.leader.election.enable"] == "false"
    assert int(props["num.io.threads"]) <= 2  # three JVMs on a small machine


def test_a_cluster_gets_distinct_ports_and_one_cluster_id(tmp_path: Path) -> None:
    from streams.devtools.broker import LocalCluster

    cluster = LocalCluster(tmp_path / "cache", brokers=3, data_dir=tmp_path / "c")
    ports = [p for n in cluster.nodes.values() for p in (n.port, n.controller_port)]
    assert len(set(ports)) == 6
    assert {n.cluster_id for n in cluster.nodes.values()} == {cluster._cluster_id()}
    again = LocalCluster(tmp_path / "cache", brokers=3, data_dir=tmp_path / "c")
    assert again.nodes[1].cluster_id == cluster.nodes[1].cluster_id, "kept with the data dir"
    assert cluster.bootstrap_servers.count(",") == 2


def test_a_detached_cluster_state_round_trips_with_its_members(tmp_path: Path) -> None:
    import dataclasses

    first = make_state(tmp_path, 11)
    other = dataclasses.replace(make_state(tmp_path, 12), bootstrap="127.0.0.1:9093")
    state = dataclasses.replace(first, members=(other,))
    again = BrokerState.from_json(state.to_json())
    assert again == state
    assert again.bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9093"
    assert [n.pid for n in again.nodes] == [11, 12]
    assert "members" not in json.loads(first.to_json()), "one broker: the old file format"


def test_the_cli_takes_a_broker_count() -> None:
    from streams.cli import build_parser

    args = build_parser().parse_args(["broker", "start", "--brokers", "3"])
    assert (args.action, args.brokers) == ("start", 3)
    assert build_parser().parse_args(["broker", "start"]).brokers == 1


def test_the_cli_passes_the_heap_to_the_broker_and_refuses_a_bad_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streams.cli import build_parser
    from streams.commands.local import cmd_broker
    from streams.devtools import broker
    from streams.errors import ConfigError
    from streams.settings import load_settings

    started: list[dict[str, Any]] = []

    def start_detached(cache_dir: Path, **kw: Any) -> BrokerState:
        started.append(kw)
        return make_state(tmp_path, 11)

    monkeypatch.setattr(broker, "start_detached", start_detached)
    settings = load_settings(cache_dir=tmp_path)
    assert cmd_broker(build_parser().parse_args(["broker", "start"]), settings) == 0
    args = build_parser().parse_args(["broker", "start", "--port", "9092", "--heap", "2g"])
    assert cmd_broker(args, settings) == 0
    assert [kw["heap"] for kw in started] == ["512m", "2g"]
    for bad in ("2 GB", "0m", "lots"):
        args = build_parser().parse_args(["broker", "start", "--heap", bad])
        with pytest.raises(ConfigError, match="--heap"):
            cmd_broker(args, settings)
    args = build_parser().parse_args(["broker", "start", "--brokers", "3", "--heap", "1g"])
    with pytest.raises(ConfigError, match="--heap sets one broker"):
        cmd_broker(args, settings)
    assert len(started) == 2
