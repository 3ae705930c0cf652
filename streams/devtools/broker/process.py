"""Processes and ports: free ports, whether a pid is a live broker, signalling a process group,
and the readiness probe (a Metadata request that lists the node as a live broker).

POSIX only: a broker runs in its own process group (its session), which is signalled whole.

May import: the standard library, aiokafka (to probe readiness), :mod:`streams.errors`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from streams.errors import BrokerError

__all__ = [
    "chosen_port_range",
    "ephemeral_range",
    "free_port",
    "free_ports",
    "is_broker_process",
    "metadata_ready",
    "pid_alive",
    "port_answers",
    "port_is_free",
    "run_coroutine",
    "signal_group",
    "terminate",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (see :func:`free_ports`)."""
    return free_ports(host, 1)[0]


# Where the OS takes the local ports of outgoing connections and of binds to port 0 (Linux).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_CHOSEN_PORT = 10_000
_CANDIDATES_TRIED = 200


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The OS's ephemeral port range ``(first, last)``, or None where it cannot be read."""
    try:
        first, last = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return None
    return first, last


def chosen_port_range(ephemeral: tuple[int, int] | None) -> range | None:
    """Where :func:`free_ports` chooses: the ports below the ephemeral range, from
    :data:`LOWEST_CHOSEN_PORT`; None (let the OS choose) where that leaves fewer than 1,000.

    >>> chosen_port_range((32768, 60999))
    range(10000, 32768)
    >>> chosen_port_range((10500, 60999)) is None
    True
    >>> chosen_port_range(None) is None
    True
    """
    if ephemeral is None or ephemeral[0] - LOWEST_CHOSEN_PORT < 1_000:
        return None
    return range(LOWEST_CHOSEN_PORT, ephemeral[0])


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports on ``host`` that nothing listens on now: every socket is held
    until all are bound.

    A port is chosen to be bound later, by another process (a broker, a controller, a
    registry). Chosen in the ephemeral range, it can be taken in between by any process of the
    machine: by a bind to port 0 or as the local port of an outgoing connection (on loopback a
    client connecting to a port nobody listens on yet can even connect to itself). Seen in the
    test run on a loaded machine: the voter port of a 3-node cluster taken by another test's
    HTTP server before that voter started, its peers reading the server's answer as a Kafka
    frame size (``OutOfMemoryError``), the voter failing with "Address already in use". So the
    ports are chosen at random below the ephemeral range (:func:`chosen_port_range`), where
    neither happens; the OS chooses where that range is unknown (not Linux) or too small.
    """
    candidates = chosen_port_range(ephemeral_range())
    rng = random.SystemRandom()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        tried = 0
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            if candidates is not None and tried < _CANDIDATES_TRIED:
                tried += 1
                try:
                    sock.bind((host, rng.choice(candidates)))
                except OSError:
                    continue
            else:
                sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (as the JVM does, with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def process_cmdline(pid: int) -> str | None:
    """The command line of ``pid``, or None when there is no such (living) process."""
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            if stat.rpartition(")")[2].split()[0] == "Z":
                return None  # a zombie: dead, waiting for its parent
            return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            return None
    try:  # no /proc (macOS): ask ps
        out = subprocess.run(
            ["ps", "-o", "stat=,command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return None
    if not out or out.startswith("Z"):
        return None
    return out.partition(" ")[2]


def pid_alive(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False  # it was our child and has just been reaped
    except ChildProcessError:
        pass  # not our child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_cmdline(pid) is not None


def is_broker_process(pid: int, config: Path) -> bool:
    """Whether ``pid`` is a live Kafka broker started with ``config`` (guards pid reuse)."""
    cmdline = process_cmdline(pid)
    return cmdline is not None and "kafka.Kafka" in cmdline and str(config) in cmdline


def signal_group(pid: int, sig: signal.Signals) -> None:
    # The broker leads its own session (start_new_session=True), so its group id is its pid.
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM the broker's process group, wait ``timeout`` s, then SIGKILL it."""
    signal_group(pid, signal.SIGTERM)
    if wait_gone(pid, timeout):
        return
    log.warning("Kafka broker pid %d ignored SIGTERM for %.0f s; killing it", pid, timeout)
    signal_group(pid, signal.SIGKILL)
    if not wait_gone(pid, 5.0):
        raise BrokerError(f"Kafka broker pid {pid} is still alive after SIGKILL")


def finalize(pid: int, temp_dir: Path | None) -> None:
    """Runs at garbage collection or interpreter exit when stop() was never called."""
    with contextlib.suppress(BrokerError):
        terminate(pid, 10.0)
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)


def run_coroutine(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine to completion from sync code, even when a loop runs in this thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


async def metadata_ready(
    bootstrap: str, request_timeout: float, node_id: int | None = None
) -> bool:
    """Whether the broker answers a Metadata request and lists itself (``node_id``, or any
    broker) as a live broker."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="trajstream-broker-probe",
        request_timeout_ms=max(500, int(request_timeout * 1000)),
    )
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        brokers = cluster.get("brokers") or []
        if node_id is None:
            return bool(brokers)
        return any(b.get("node_id") == node_id for b in brokers)
    except (TimeoutError, KafkaError, OSError):
        return False
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
