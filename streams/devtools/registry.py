"""A local schema registry for tests and trying things out: Apicurio Registry, run from its
distribution, with in-memory storage and its Confluent-compatible API at ``/apis/ccompat/v7``.

The distribution (``io.apicurio:apicurio-registry-app:<version>``, classifier ``all``, a
``tar.gz`` of about 160 MB) is fetched once with Maven into ``<cache_dir>`` and unpacked
there, as the broker's jars are; it starts with ``java -jar quarkus-run.jar`` in seconds. Its
classes need Java 21 or newer (class file version 65): :func:`find_java` looks at
``$JAVA_HOME``, the ``java`` on PATH and the JDKs under ``/usr/lib/jvm`` (where Debian and
Temurin packages put them) and takes the newest one that is new enough.

Example::

    with LocalRegistry(Path(".cache/trajstream")) as registry:
        print(registry.url)        # http://127.0.0.1:40123/apis/ccompat/v7

It listens on loopback on free ports (its HTTP API, and the management interface that
Apicurio's build keeps on, which would take 0.0.0.0:9000 otherwise),
starts with the global compatibility level BACKWARD (Apicurio's own default is NONE, which
trajstream refuses), and is stopped (its process group: SIGTERM, then SIGKILL) by
:meth:`LocalRegistry.stop`, also at interpreter exit.

May import: the standard library, httpx, :mod:`streams.errors`, the broker's helpers.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from ..errors import BrokerError
from .broker.jars import fetch_artifact, file_lock, with_logs, write_atomic
from .broker.process import finalize, free_port, signal_group

__all__ = ["APICURIO_VERSION", "LocalRegistry", "find_java", "java_version"]

log = logging.getLogger(__name__)

APICURIO_VERSION = "3.3.3"
APICURIO_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
MIN_JAVA = 21
JVM_DIRS = (Path("/usr/lib/jvm"),)  # where Debian's and Temurin's packages install JDKs

_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_version(java: str) -> int | None:
    """The major version of the ``java`` executable (``java -version``), or None."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _VERSION.search(out.stderr + out.stdout)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


def find_java(minimum: int = MIN_JAVA) -> tuple[str, int] | None:
    """The newest ``java`` of at least ``minimum``: ``$JAVA_HOME``, PATH, then every JDK under
    ``/usr/lib/jvm``; None when there is none."""
    candidates: list[str] = []
    home = os.environ.get("JAVA_HOME")
    if home:
        candidates.append(str(Path(home) / "bin" / "java"))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(on_path)
    for root in JVM_DIRS:
        if root.is_dir():
            candidates.extend(str(p) for p in sorted(root.glob("*/bin/java")))
    best: tuple[str, int] | None = None
    seen: set[str] = set()
    for java in candidates:
        real = os.path.realpath(java)
        if real in seen or not os.access(real, os.X_OK):
            continue
        seen.add(real)
        version = java_version(real)
        if version is not None and version >= minimum and (best is None or version > best[1]):
            best = (real, version)
    return best


class LocalRegistry:
    """Apicurio Registry as a child process on a free loopback port (in-memory storage)."""

    def __init__(self, cache_dir: Path, host: str = "127.0.0.1", heap: str = "320m") -> None:
        self.cache_dir = Path(cache_dir).absolute()
        self.host = host
        self.heap = heap
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._dir: Path | None = None

    @property
    def home(self) -> Path:
        """The unpacked distribution: ``<cache_dir>/apicurio-registry-<version>``."""
        return self.cache_dir / f"apicurio-registry-{APICURIO_VERSION}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API: what ``kafka.schema_registry.url`` is set to."""
        if self.port is None:
            raise BrokerError("the registry's port is chosen at start(); start it first")
        return f"http://{self.host}:{self.port}/apis/ccompat/v7"

    @property
    def log_file(self) -> Path | None:
        return self._dir / "registry.out" if self._dir else None

    def fetch(self) -> Path:
        """Fetch (Maven) and unpack the distribution once; return its directory."""
        marker = self.home / ".unpacked"
        if marker.exists():
            return self.home
        archive = fetch_artifact(APICURIO_ARTIFACT, self.cache_dir)
        with file_lock(self.cache_dir / f".apicurio-{APICURIO_VERSION}.lock"):
            if not marker.exists():
                shutil.rmtree(self.home, ignore_errors=True)
                staging = Path(tempfile.mkdtemp(prefix=".apicurio-", dir=self.cache_dir))
                try:
                    with tarfile.open(archive) as tar:
                        tar.extractall(staging, filter="data")
                    os.replace(staging, self.home)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                if not (self.home / "quarkus-run.jar").exists():
                    raise BrokerError(f"{archive} holds no quarkus-run.jar")
                write_atomic(marker, APICURIO_VERSION + "\n")
        return self.home

    def start(self, timeout: float = 90) -> str:
        """Start the registry and wait until its API answers; return :attr:`url`."""
        found = find_java()
        if found is None:
            raise BrokerError(
                f"the local schema registry (Apicurio {APICURIO_VERSION}) needs Java "
                f"{MIN_JAVA} or newer: none at $JAVA_HOME, on PATH or under /usr/lib/jvm"
            )
        java, _ = found
        home = self.fetch()
        self.port = free_port(self.host)
        self._dir = Path(tempfile.mkdtemp(prefix="trajstream-registry-"))
        command = [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:ActiveProcessorCount=1",
            f"-Dquarkus.http.host={self.host}",
            f"-Dquarkus.http.port={self.port}",
            # the management interface is on in Apicurio's build whatever is said at run time
            # (enabled=false does not turn it off): on all interfaces at 9000 unless told
            "-Dquarkus.management.enabled=false",
            f"-Dquarkus.management.host={self.host}",
            f"-Dquarkus.management.port={free_port(self.host)}",
            "-Dquarkus.log.level=WARN",
            f"-Djava.io.tmpdir={self._dir}",
            "-jar",
            str(home / "quarkus-run.jar"),
        ]
        assert self.log_file is not None
        with self.log_file.open("ab") as out:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                start_new_session=True,
            )
        self._finalizer = weakref.finalize(self, finalize, self._proc.pid, self._dir)
        try:
            self._wait_ready(time.monotonic() + timeout, timeout)
            self.set_compatibility("BACKWARD")
        except BaseException:
            self.stop()
            raise
        log.info("schema registry pid %d ready at %s", self._proc.pid, self.url)
        return self.url

    def _wait_ready(self, deadline: float, timeout: float) -> None:
        assert self._proc is not None and self.log_file is not None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerError(
                    with_logs(f"the schema registry exited with code {code}", self.log_file)
                )
            try:
                if httpx.get(f"{self.url}/config", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BrokerError(
                    with_logs(f"the schema registry was not ready within {timeout:g} s",
                              self.log_file)
                )
            time.sleep(0.3)

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        """Set the global (or a subject's) compatibility level."""
        path = f"/config/{subject}" if subject else "/config"
        response = httpx.put(
            self.url + path,
            json={"compatibility": level},
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
            timeout=10,
        )
        if response.status_code != 200:
            raise BrokerError(f"setting compatibility {level} failed: {response.text}")

    def stop(self, timeout: float = 15) -> None:
        """Stop the registry (SIGTERM, then SIGKILL) and remove its temp dir."""
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None and proc.poll() is None:
            signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

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
