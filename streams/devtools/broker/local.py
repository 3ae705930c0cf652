"""One broker process: :class:`LocalBroker`, a KRaft node (broker+controller) run as a child.

Alone it is a one-node cluster; :class:`~streams.devtools.broker.cluster.LocalCluster` starts
several as the nodes of one cluster (``node_id``, ``voters``, ``cluster_id``). A broker's data
dir holds its ``server.properties``, its Kafka log segments under ``kafka-logs/``,
``broker.log`` (its own log, WARN and above) and ``broker.out`` (the JVM's stdout and stderr).
When the broker fails to start, the error quotes the end of both.

``LocalBroker(cache_dir, sasl_ssl=True)`` adds a second listener that speaks SASL over TLS,
as managed Kafka services do, beside the PLAINTEXT one: a CA and a server certificate for
127.0.0.1 and localhost are made at start and written into the data dir as PEM (``ca.pem``,
and ``server-keystore.pem`` that the broker reads as a ``PEM`` keystore); one user,
:attr:`LocalBroker.sasl_username`, may log in with PLAIN (the listener's JAAS config) and
SCRAM-SHA-256/512 (credentials added when the storage is formatted).

May import: the standard library, :mod:`streams.errors`, the other broker modules.
"""

from __future__ import annotations

import functools
import logging
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from streams.errors import BrokerError

from .config import TlsFiles, new_cluster_id, render_server_properties, tls_hosts
from .config import write_certificates as write_certificates
from .jars import LOG_PROPERTY, KafkaJars, require_executable, with_logs
from .process import (
    finalize,
    free_port,
    free_ports,
    metadata_ready,
    port_answers,
    port_is_free,
    run_coroutine,
    signal_group,
)

__all__ = ["LocalBroker"]

log = logging.getLogger(__name__)

# Kept referenced so that Popen.__del__ does not warn about a child left running on purpose.
DETACHED: list[subprocess.Popen[bytes]] = []


class LocalBroker:
    """A Kafka broker (KRaft, broker+controller) run as a child process.

    ``cache_dir`` holds the fetched jars (shared by every broker); ``data_dir`` holds this
    broker's config, data and logs, and is a fresh temp dir removed on :meth:`stop` when None.
    ``port`` 0 picks a free port at :meth:`start`; the controller port is picked free unless
    ``controller_port`` is given (a cluster fixes every node's ports before any starts).

    Example::

        with LocalBroker(Path(".cache/trajstream")) as broker:
            print(broker.bootstrap_servers)   # "127.0.0.1:40123"

    :meth:`start` blocks; from async code, call it with ``await asyncio.to_thread(...)``.
    A broker not stopped explicitly is stopped when the object is collected or the
    interpreter exits (not when the Python process is killed).
    """

    def __init__(
        self,
        cache_dir: Path,
        data_dir: Path | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        heap: str = "512m",
        sasl_ssl: bool = False,
        *,
        node_id: int = 1,
        controller_port: int | None = None,
        voters: str | None = None,
        cluster_id: str | None = None,
        cluster_size: int = 1,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        self.cache_dir = Path(cache_dir).absolute()
        self.jars = KafkaJars(self.cache_dir)
        self.sasl_ssl = sasl_ssl
        self.sasl_username = "trajstream"
        self._sasl_password: str | None = None
        self._sasl_ssl_port: int | None = None
        self._tls: TlsFiles | None = None
        self.host = host
        self.heap = heap
        self.node_id = node_id
        self.voters = voters
        self.cluster_id = cluster_id
        self.cluster_size = cluster_size
        self.jvm_options = jvm_options
        self._requested_port = port
        self._port: int | None = port or None
        self._controller_port: int | None = controller_port
        self._requested_controller_port: int | None = controller_port
        self._given_data_dir = Path(data_dir).absolute() if data_dir is not None else None
        self._data_dir: Path | None = self._given_data_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # paths

    @property
    def kafka_dir(self) -> Path:
        """``<cache_dir>/kafka-<version>``: the pom, the log4j2 config, ``libs/``."""
        return self.jars.kafka_dir

    @property
    def libs_dir(self) -> Path:
        return self.jars.libs_dir

    @property
    def log4j2_config(self) -> Path:
        return self.jars.log4j2_config

    @property
    def data_dir(self) -> Path | None:
        """This broker's data dir; None before :meth:`start` when it is a temp dir."""
        return self._data_dir

    @property
    def log_file(self) -> Path | None:
        """The broker's own log (WARN and above)."""
        return self._data_dir / "broker.log" if self._data_dir else None

    @property
    def stdout_file(self) -> Path | None:
        """The JVM's stdout and stderr."""
        return self._data_dir / "broker.out" if self._data_dir else None

    @property
    def config_file(self) -> Path | None:
        return self._data_dir / "server.properties" if self._data_dir else None

    # state

    @property
    def pid(self) -> int | None:
        """The broker's pid while it runs, else None."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def controller_port(self) -> int | None:
        return self._controller_port

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for Kafka clients; known once a port is chosen."""
        if self._port is None:
            raise BrokerError("the broker's port is chosen at start(); start it first")
        return f"{self.host}:{self._port}"

    @property
    def sasl_ssl_bootstrap_servers(self) -> str:
        """``host:port`` of the SASL_SSL listener (``sasl_ssl=True``), known after start."""
        if self._sasl_ssl_port is None:
            raise BrokerError("no SASL_SSL listener: LocalBroker(..., sasl_ssl=True), started")
        return f"{self.host}:{self._sasl_ssl_port}"

    @property
    def ca_file(self) -> Path:
        """The PEM file of the CA that signed the SASL_SSL listener's certificate."""
        if self._tls is None:
            raise BrokerError("no SASL_SSL listener: LocalBroker(..., sasl_ssl=True), started")
        return self._tls.ca_file

    @property
    def sasl_password(self) -> str:
        """The password of :attr:`sasl_username` for PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512."""
        if self._sasl_password is None:
            raise BrokerError("no SASL_SSL listener: LocalBroker(..., sasl_ssl=True), started")
        return self._sasl_password

    # lifecycle

    def fetch(self) -> Path:
        """Fetch the broker's jars with Maven, once per cache dir; return the libs dir."""
        return self.jars.fetch()

    def _java_command(self, java: str, main: str, *args: str) -> list[str]:
        assert self.log_file is not None
        return [
            java,
            f"-Xmx{self.heap}",
            "-Djava.awt.headless=true",
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.log4j2_config}",
            f"-D{LOG_PROPERTY}={self.log_file}",
            "-cp",
            str(self.libs_dir / "*"),  # java expands the wildcard itself
            main,
            *args,
        ]

    def start(self, timeout: float = 60) -> str:
        """Start the broker and wait until it serves metadata; return ``host:port``.

        Fetches the jars first if needed (not counted in ``timeout``), formats the storage
        of a new data dir, and raises :class:`BrokerError` with the end of the broker's logs
        when it exits early or is not ready within ``timeout`` seconds.
        """
        if self.pid is not None:
            return self.bootstrap_servers
        deadline = time.monotonic() + timeout
        self.launch(timeout)
        try:
            self.wait_ready(deadline, timeout)
        except BaseException:
            self._stop_quietly()
            raise
        assert self._proc is not None
        log.info("Kafka broker pid %d ready at %s", self._proc.pid, self.bootstrap_servers)
        return self.bootstrap_servers

    def launch(self, timeout: float = 60) -> None:
        """Start the JVM without waiting for it to be ready (a cluster starts every node
        first: none is ready before a quorum of controllers runs)."""
        java = require_executable("java")
        self.fetch()
        deadline = time.monotonic() + timeout
        self._choose_ports()
        owns_data_dir = self._given_data_dir is None
        if owns_data_dir:
            self._data_dir = Path(tempfile.mkdtemp(prefix="trajstream-kafka-"))
        data_dir = self._data_dir
        assert data_dir is not None and self.config_file is not None
        assert self.stdout_file is not None and self.log_file is not None
        assert self._port is not None and self._controller_port is not None
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            log_dir = data_dir / "kafka-logs"
            self.config_file.write_text(
                render_server_properties(
                    host=self.host,
                    port=self._port,
                    controller_port=self._controller_port,
                    log_dir=log_dir,
                    node_id=self.node_id,
                    sasl_ssl=self._prepare_sasl_ssl(data_dir),
                    voters=self.voters,
                    cluster_size=self.cluster_size,
                )
            )
            if not (log_dir / "meta.properties").exists():
                self._format(java, deadline)

            with self.stdout_file.open("ab") as out:
                self._proc = subprocess.Popen(
                    self._java_command(java, "kafka.Kafka", str(self.config_file)),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=data_dir,
                    start_new_session=True,
                )
            self._finalizer = weakref.finalize(
                self, finalize, self._proc.pid, data_dir if owns_data_dir else None
            )
        except BaseException:
            self._stop_quietly()
            raise

    def _choose_ports(self) -> None:
        if self._requested_port:
            if not port_is_free(self.host, self._requested_port):
                raise BrokerError(f"port {self.host}:{self._requested_port} is already in use")
            self._port = self._requested_port
            wanted = self._requested_controller_port
            if wanted and (self.voters is not None or port_is_free(self.host, wanted)):
                self._controller_port = wanted  # a cluster's voters name this port
            else:
                self._controller_port = free_port(self.host)
            while self._controller_port == self._port:
                self._controller_port = free_port(self.host)
        else:
            self._port, self._controller_port = free_ports(self.host, 2)
        if self.sasl_ssl:
            taken = {self._port, self._controller_port}
            self._sasl_ssl_port = next(
                p for p in iter(lambda: free_port(self.host), None) if p not in taken
            )

    def _prepare_sasl_ssl(self, data_dir: Path) -> tuple[int, Path, str, str] | None:
        """Certificates and the password, made once per data dir (a kept data dir keeps the
        SCRAM credentials it was formatted with)."""
        if not self.sasl_ssl:
            return None
        assert self._sasl_ssl_port is not None
        tls_dir = data_dir / "tls"
        secret = tls_dir / "sasl-password"
        if secret.exists():
            self._tls = TlsFiles(
                ca_file=tls_dir / "server-ca.pem",
                cert_file=tls_dir / "server-cert.pem",
                key_file=tls_dir / "server-key.pem",
                keystore=tls_dir / "server-keystore.pem",
            )
            self._sasl_password = secret.read_text().strip()
        else:
            self._tls = write_certificates(tls_dir, hosts=tls_hosts(self.host))
            self._sasl_password = secrets.token_hex(16)
            secret.write_text(self._sasl_password + "\n")
            secret.chmod(0o600)
        return (self._sasl_ssl_port, self._tls.keystore, self.sasl_username, self._sasl_password)

    def restart(self, timeout: float = 60) -> str:
        """Stop the broker and start it again on the same data dir and ports.

        What an operator's broker restart looks like to clients: the same address, every topic,
        offset and committed group offset kept. Needs a ``data_dir`` given to the constructor (a
        temporary one is deleted at stop).
        """
        if self._given_data_dir is None:
            raise BrokerError("restart keeps the data: give LocalBroker a data_dir")
        self.stop()
        return self.start_again(timeout)

    def start_again(self, timeout: float = 60) -> str:
        """Start a stopped (or killed) broker on its data dir and ports."""
        port, controller = self._port, self._controller_port
        self._requested_port = port or 0
        self._requested_controller_port = controller
        deadline = time.monotonic() + timeout
        while port and not port_is_free(self.host, port) and time.monotonic() < deadline:
            time.sleep(0.2)  # the old process's socket is released a moment after it exits
        return self.start(timeout=max(1.0, deadline - time.monotonic()))

    def kill(self) -> None:
        """SIGKILL the broker (no shutdown: what a crash looks like); the data dir is kept."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def _format(self, java: str, deadline: float) -> None:
        assert self.config_file is not None and self.stdout_file is not None
        scram: list[str] = []
        if self._sasl_password is not None:
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                scram += [
                    "--add-scram",
                    f"{mechanism}=[name={self.sasl_username},password={self._sasl_password}]",
                ]
        command = self._java_command(
            java,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id or new_cluster_id(),
            "-c",
            str(self.config_file),
            *scram,
        )
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BrokerError("formatting the broker's storage timed out") from exc
        with self.stdout_file.open("ab") as out:
            out.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise BrokerError(
                with_logs(
                    f"formatting the broker's storage failed (exit code {result.returncode})",
                    self.stdout_file,
                )
            )

    def wait_ready(self, deadline: float, timeout: float) -> None:
        """Wait until the broker lists itself as a live broker in its metadata."""
        assert self._proc is not None and self._port is not None
        assert self.log_file is not None and self.stdout_file is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(
                    with_logs(
                        f"the Kafka broker exited with code {code} before it was ready",
                        self.log_file,
                        self.stdout_file,
                    )
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    with_logs(
                        f"the Kafka broker was not ready at {self.bootstrap_servers} "
                        f"within {timeout:g} s",
                        self.log_file,
                        self.stdout_file,
                    )
                )
            if port_answers(self.host, self._port, timeout=min(1.0, remaining)):
                probe = functools.partial(
                    metadata_ready,
                    self.bootstrap_servers,
                    min(5.0, remaining),
                    self.node_id if self.voters else None,
                )
                if run_coroutine(probe):
                    return
            time.sleep(0.2)

    def stop(self, timeout: float = 20) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout`` s); remove a temp data dir."""
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        try:
            if proc is not None and proc.poll() is None:
                signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    log.warning("Kafka broker pid %d ignored SIGTERM; killing it", proc.pid)
                    signal_group(proc.pid, signal.SIGKILL)
                    try:
                        proc.wait(5)
                    except subprocess.TimeoutExpired as exc:
                        raise BrokerError(f"Kafka broker pid {proc.pid} survived SIGKILL") from exc
        finally:
            if self._given_data_dir is None and self._data_dir is not None:
                shutil.rmtree(self._data_dir, ignore_errors=True)
                self._data_dir = None

    def _stop_quietly(self) -> None:
        try:
            self.stop(timeout=5)
        except BrokerError as exc:  # keep the error that made us stop
            log.warning("%s", exc)

    def detach(self) -> int:
        """Let the running broker outlive this object (and this process); return its pid."""
        if self._proc is None:
            raise BrokerError("no broker to detach")
        pid = self._proc.pid
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        DETACHED.append(self._proc)
        self._proc = None
        return pid

    _detach = detach  # the name of older callers

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
        port = self._port if self._port is not None else "?"
        return f"LocalBroker({self.host}:{port}, pid={self.pid}, data_dir={self._data_dir})"
