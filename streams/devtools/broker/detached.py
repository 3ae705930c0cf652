"""Detached mode (the CLI): one broker, or one cluster of N, per cache dir, running in the
background and outliving the Python process, recorded in ``<cache_dir>/broker.json``.

:func:`start_detached`, :func:`status` and :func:`stop_detached` are what ``trajstream broker
start|status|stop`` call. A cluster is recorded as its first node's state with the others as
``members``; :attr:`BrokerState.bootstrap_servers` lists them all.

May import: the standard library, :mod:`streams.errors`, the other broker modules.
"""

from __future__ import annotations

import json
import logging
import signal
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from streams.errors import BrokerError

from .cluster import LocalCluster
from .jars import KAFKA_VERSION, write_atomic
from .local import LocalBroker
from .process import (
    free_port,
    is_broker_process,
    port_answers,
    port_is_free,
    signal_group,
    terminate,
)

__all__ = ["DEFAULT_DETACHED_PORT", "BrokerState", "start_detached", "status", "stop_detached"]

log = logging.getLogger(__name__)

DEFAULT_DETACHED_PORT = 9092
STATE_FILE = "broker.json"


@dataclass(frozen=True)
class BrokerState:
    """A detached broker, as recorded in ``<cache_dir>/broker.json``; a cluster's first node,
    with the other nodes in ``members``."""

    pid: int
    bootstrap: str
    data_dir: Path
    log_file: Path
    stdout_file: Path
    config_file: Path
    kafka_version: str
    started_at: str  # ISO 8601, UTC
    members: tuple[BrokerState, ...] = field(default=())

    def to_json(self) -> str:
        return json.dumps(self._fields(), indent=2) + "\n"

    def _fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "members":
                if value:
                    out[name] = [m._fields() for m in value]
            else:
                out[name] = str(value) if isinstance(value, Path) else value
        return out

    @classmethod
    def from_json(cls, text: str) -> BrokerState:
        return cls._from(json.loads(text))

    @classmethod
    def _from(cls, raw: dict[str, Any]) -> BrokerState:
        return cls(
            pid=int(raw["pid"]),
            bootstrap=str(raw["bootstrap"]),
            data_dir=Path(raw["data_dir"]),
            log_file=Path(raw["log_file"]),
            stdout_file=Path(raw["stdout_file"]),
            config_file=Path(raw["config_file"]),
            kafka_version=str(raw["kafka_version"]),
            started_at=str(raw["started_at"]),
            members=tuple(cls._from(m) for m in raw.get("members", [])),
        )

    @property
    def nodes(self) -> tuple[BrokerState, ...]:
        return (self, *self.members)

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address, comma-separated: what clients bootstrap from."""
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def host(self) -> str:
        return self.bootstrap.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.bootstrap.rpartition(":")[2])


def _state_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / STATE_FILE


def _read_state(cache_dir: Path) -> BrokerState | None:
    path = _state_path(cache_dir)
    try:
        return BrokerState.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable broker state %s: %s", path, exc)
        return None


def status(cache_dir: Path) -> BrokerState | None:
    """The detached broker (or cluster) of ``cache_dir`` if a node's process is alive and its
    port answers (a cluster with a node down still serves)."""
    state = _read_state(cache_dir)
    if state is None:
        return None
    for node in state.nodes:
        if is_broker_process(node.pid, node.config_file) and port_answers(node.host, node.port):
            return state
    return None


def start_detached(
    cache_dir: Path,
    port: int | None = None,
    data_dir: Path | None = None,
    host: str = "127.0.0.1",
    heap: str = "512m",
    timeout: float = 60,
    brokers: int = 1,
) -> BrokerState:
    """Start a background broker (``brokers`` > 1: a cluster) that outlives this process;
    return its recorded state.

    Idempotent: when ``<cache_dir>/broker.json`` records a live broker, that one is returned
    (whatever ``port`` and ``brokers`` say). ``port`` None means 9092 if it is free, else a free
    port (logged as a warning); an explicit port that is taken is an error; a cluster's other
    nodes take the ports after it when free. ``data_dir`` defaults to ``<cache_dir>/data``
    (``<cache_dir>/data-<N>-brokers`` for a cluster) and is kept across restarts.
    """
    cache_dir = Path(cache_dir).absolute()
    running = status(cache_dir)
    if running is not None:
        if port is not None and port != running.port:
            log.warning(
                "a broker is already running at %s; not starting one on port %d",
                running.bootstrap_servers,
                port,
            )
        return running
    recorded = _read_state(cache_dir)
    if recorded is not None and any(
        is_broker_process(n.pid, n.config_file) for n in recorded.nodes
    ):
        # Alive but not answering: a second broker on the same data dir would fail on its lock.
        raise BrokerError(
            f"the broker recorded in {_state_path(cache_dir)} (pid {recorded.pid}) is running "
            f"but does not answer at {recorded.bootstrap_servers}; stop it first. "
            f"Its log: {recorded.log_file}"
        )

    if port is None:
        if port_is_free(host, DEFAULT_DETACHED_PORT):
            port = DEFAULT_DETACHED_PORT
        else:
            port = free_port(host)
            log.warning(
                "port %d is in use on %s; the broker will listen on port %d instead",
                DEFAULT_DETACHED_PORT,
                host,
                port,
            )
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    if brokers > 1:
        return _start_cluster(cache_dir, port, data_dir, host, timeout, brokers, started_at)
    broker = LocalBroker(
        cache_dir,
        data_dir=data_dir if data_dir is not None else cache_dir / "data",
        port=port,
        host=host,
        heap=heap,
    )
    bootstrap = broker.start(timeout=timeout)
    state = _state_of(broker, bootstrap, broker.detach(), started_at)
    write_atomic(_state_path(cache_dir), state.to_json())
    return state


def _start_cluster(
    cache_dir: Path,
    port: int,
    data_dir: Path | None,
    host: str,
    timeout: float,
    brokers: int,
    started_at: str,
) -> BrokerState:
    ports = [port]
    candidate = port + 1
    while len(ports) < brokers:
        ports.append(candidate if port_is_free(host, candidate) else free_port(host))
        candidate += 1
    cluster = LocalCluster(
        cache_dir,
        brokers=brokers,
        data_dir=data_dir if data_dir is not None else cache_dir / f"data-{brokers}-brokers",
        host=host,
        ports=ports,
    )
    cluster.start(timeout=max(timeout, 90))
    pids = cluster.detach()
    nodes = [
        _state_of(node, node.bootstrap_servers, pid, started_at)
        for node, pid in zip(cluster.nodes.values(), pids, strict=True)
    ]
    first, *others = nodes
    state = replace(first, members=tuple(others))
    write_atomic(_state_path(cache_dir), state.to_json())
    return state


def _state_of(broker: LocalBroker, bootstrap: str, pid: int, started_at: str) -> BrokerState:
    assert broker.data_dir and broker.log_file and broker.stdout_file and broker.config_file
    return BrokerState(
        pid=pid,
        bootstrap=bootstrap,
        data_dir=broker.data_dir,
        log_file=broker.log_file,
        stdout_file=broker.stdout_file,
        config_file=broker.config_file,
        kafka_version=KAFKA_VERSION,
        started_at=started_at,
    )


def stop_detached(cache_dir: Path, timeout: float = 20) -> bool:
    """Stop the detached broker (every node of a cluster) of ``cache_dir``; False when none
    was running. The state file is removed either way; the data dir is kept."""
    state = _read_state(cache_dir)
    if state is None:
        return False
    alive = [n for n in state.nodes if is_broker_process(n.pid, n.config_file)]
    for node in alive:  # all at once: a cluster's last nodes would wait for a lost quorum
        signal_group(node.pid, signal.SIGTERM)
    for node in alive:
        terminate(node.pid, timeout)
    stopped = bool(alive)
    _state_path(cache_dir).unlink(missing_ok=True)
    return stopped
