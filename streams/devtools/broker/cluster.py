"""A cluster of N local brokers: :class:`LocalCluster`, for the multi-broker tests and
``trajstream broker start --brokers 3``.

Every node is a KRaft combined node (broker and controller) and every node is a voter of the
controller quorum, so three nodes keep a quorum (and every partition replicated three times
keeps a leader and an in-sync replica set of at least two) while one of them is down. The
nodes are started together (none is ready before a quorum runs) and waited for together.

For chaos tests: :meth:`LocalCluster.kill` (SIGKILL) and :meth:`LocalCluster.start_node`
(again, on its data dir and ports), :meth:`LocalCluster.leader_of` (who leads a partition) and
:meth:`LocalCluster.active_controller` (who leads the controller quorum: asked with the
DescribeQuorum request, which a broker forwards to the quorum's leader; aiokafka has no admin
call for it, so the request is declared here).

May import: the standard library, aiokafka, :mod:`streams.errors`, the other broker modules.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeAlias

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from streams.errors import BrokerError

from .config import NodeAddress, new_cluster_id, voters_of
from .local import LocalBroker
from .process import free_ports, run_coroutine, signal_group

__all__ = ["CLUSTER_HEAP", "CLUSTER_JVM_OPTIONS", "LocalCluster"]

log = logging.getLogger(__name__)

CLUSTER_HEAP = "320m"
# Three JVMs on two cores: the serial collector (no parallel GC threads) and a JIT that
# believes in two processors keep a node's idle cost low.
CLUSTER_JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:ActiveProcessorCount=2", "-Xss512k")


_REPLICA_STATE = (("replica_id", Int32), ("log_end_offset", Int64), ("tags", TaggedFields))


class DescribeQuorumResponse_v0(Response):  # type: ignore[misc]
    API_KEY = 55
    API_VERSION = 0
    SCHEMA = Schema(
        ("error_code", Int16),
        (
            "topics",
            CompactArray(
                ("topic_name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("high_watermark", Int64),
                        (
                            "current_voters",
                            CompactArray(*_REPLICA_STATE),
                        ),
                        (
                            "observers",
                            CompactArray(*_REPLICA_STATE),
                        ),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class DescribeQuorumRequest_v0(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 55
    API_VERSION = 0
    RESPONSE_TYPE = DescribeQuorumResponse_v0
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_name", CompactString("utf-8")),
                ("partitions", CompactArray(("partition_index", Int32), ("tags", TaggedFields))),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


DescribeQuorumRequestStruct: TypeAlias = DescribeQuorumRequest_v0


class DescribeQuorumRequest(Request[DescribeQuorumRequestStruct]):  # type: ignore[misc]
    """The metadata log's quorum: who leads it (the active controller)."""

    API_KEY = 55

    def build(
        self, request_struct_class: type[DescribeQuorumRequestStruct]
    ) -> DescribeQuorumRequestStruct:
        return request_struct_class([("__cluster_metadata", [(0, {})], {})], {})


class LocalCluster:
    """``brokers`` local Kafka nodes forming one KRaft cluster on ``host``.

    ``data_dir`` (kept across restarts) holds ``node-<id>/`` per node; None: a temp dir removed
    at :meth:`stop`. Example::

        with LocalCluster(Path(".cache/trajstream"), brokers=3) as cluster:
            print(cluster.bootstrap_servers)   # "127.0.0.1:40123,127.0.0.1:40125,..."
            cluster.kill(cluster.leader_of("orders", 0))
    """

    def __init__(
        self,
        cache_dir: Path,
        brokers: int = 3,
        data_dir: Path | None = None,
        host: str = "127.0.0.1",
        heap: str = CLUSTER_HEAP,
        jvm_options: tuple[str, ...] = CLUSTER_JVM_OPTIONS,
        ports: list[int] | None = None,
    ) -> None:
        if brokers < 1:
            raise BrokerError(f"a cluster needs at least one broker, not {brokers}")
        self.cache_dir = Path(cache_dir).absolute()
        self.count = brokers
        self.host = host
        self._owns_data_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="trajstream-cluster-"))
            if data_dir is None
            else Path(data_dir).absolute()
        )
        chosen = free_ports(host, 2 * brokers)
        if ports is not None:  # fixed broker ports (the detached CLI cluster)
            if len(ports) != brokers:
                raise BrokerError(f"{len(ports)} ports given for {brokers} brokers")
            taken = set(ports)
            controllers = [p for p in chosen if p not in taken][:brokers]
            chosen = [p for pair in zip(ports, controllers, strict=True) for p in pair]
        addresses = [
            NodeAddress(i + 1, chosen[2 * i], chosen[2 * i + 1]) for i in range(brokers)
        ]
        voters = voters_of(host, addresses)
        cluster_id = self._cluster_id()
        self.nodes: dict[int, LocalBroker] = {
            a.node_id: LocalBroker(
                self.cache_dir,
                data_dir=self.data_dir / f"node-{a.node_id}",
                port=a.port,
                host=host,
                heap=heap,
                node_id=a.node_id,
                controller_port=a.controller_port,
                voters=voters,
                cluster_id=cluster_id,
                cluster_size=brokers,
                jvm_options=jvm_options,
            )
            for a in addresses
        }

    def _cluster_id(self) -> str:
        # a kept data dir keeps its cluster id: every node was formatted with it
        path = self.data_dir / "cluster-id"
        if path.exists():
            return path.read_text().strip()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cluster_id = new_cluster_id()
        path.write_text(cluster_id + "\n")
        return cluster_id

    @property
    def bootstrap_servers(self) -> str:
        """Every node's ``host:port``, comma-separated (a client needs only one to answer)."""
        return ",".join(n.bootstrap_servers for n in self.nodes.values())

    def fetch(self) -> Path:
        return next(iter(self.nodes.values())).fetch()

    def start(self, timeout: float = 120) -> str:
        """Start every node and wait until each lists itself as a live broker."""
        self.fetch()
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes.values():
                if node.pid is None:
                    node.launch(timeout)
            for node in self.nodes.values():
                node.wait_ready(deadline, timeout)
        except BaseException:
            self.stop()
            raise
        log.info("Kafka cluster of %d ready at %s", self.count, self.bootstrap_servers)
        return self.bootstrap_servers

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (its data dir and ports are kept for :meth:`start_node`)."""
        self.nodes[node_id].kill()

    def start_node(self, node_id: int, timeout: float = 90) -> None:
        """Start a killed or stopped node again, on its data dir and ports."""
        self.nodes[node_id].start_again(timeout)

    def alive(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.pid is not None]

    def leader_of(self, topic: str, partition: int = 0, timeout: float = 30) -> int:
        """The node that leads ``topic``'s ``partition`` now."""

        async def ask() -> int:
            async with _admin(self._live_bootstrap()) as admin:
                for desc in await admin.describe_topics([topic]):
                    for p in desc["partitions"]:
                        if p["partition"] == partition and p["leader"] >= 0:
                            return int(p["leader"])
            return -1

        return self._until_known(ask, f"the leader of {topic}[{partition}]", timeout)

    def isr_of(self, topic: str, partition: int = 0) -> list[int]:
        """The in-sync replicas of ``topic``'s ``partition`` now."""

        async def ask() -> list[int]:
            async with _admin(self._live_bootstrap()) as admin:
                for desc in await admin.describe_topics([topic]):
                    for p in desc["partitions"]:
                        if p["partition"] == partition:
                            return sorted(int(r) for r in p["isr"])
            return []

        return run_coroutine(ask)

    def active_controller(self, timeout: float = 30) -> int:
        """The node that leads the controller quorum (the active controller) now."""

        async def ask() -> int:
            async with _admin(self._live_bootstrap()) as admin:
                response = await admin._send_request(DescribeQuorumRequest())
            obj = response.to_object()
            for topic in obj["topics"]:
                for p in topic["partitions"]:
                    if p["error_code"] == 0 and p["leader_id"] >= 0:
                        return int(p["leader_id"])
            return -1

        return self._until_known(ask, "the active controller", timeout)

    def _live_bootstrap(self) -> str:
        live = [n.bootstrap_servers for n in self.nodes.values() if n.pid is not None]
        if not live:
            raise BrokerError("no node of the cluster is running")
        return ",".join(live)

    def _until_known(self, ask: Any, what: str, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                found = run_coroutine(ask)
            except Exception as exc:  # a node going down answers with errors for a moment
                last = exc
            else:
                if found >= 0:
                    return int(found)
            time.sleep(0.5)
        raise BrokerError(f"{what} was not known within {timeout:g} s ({last})")

    def stop(self, timeout: float = 20) -> None:
        """Stop every node; remove a temp data dir.

        Every node is signalled first: stopped one by one, the last ones would wait for a
        controller quorum that is gone before they shut down."""
        errors = []
        for node in self.nodes.values():
            if node.pid is not None:
                signal_group(node.pid, signal.SIGTERM)
        for node in self.nodes.values():
            try:
                node.stop(timeout)
            except BrokerError as exc:
                errors.append(exc)
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        if errors:
            raise errors[0]

    def detach(self) -> list[int]:
        """Let every node outlive this object; return their pids by node id order."""
        return [node.detach() for node in self.nodes.values()]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster({self.count} nodes, alive={self.alive()}, data_dir={self.data_dir})"


class _admin:
    """An admin client for one question."""

    def __init__(self, bootstrap: str) -> None:
        self.client = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, client_id="trajstream-cluster", request_timeout_ms=5000
        )

    async def __aenter__(self) -> AIOKafkaAdminClient:
        await self.client.start()
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
