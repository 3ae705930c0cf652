"""A test run stopped with SIGTERM tears its fixtures down: a real pytest process, a real
service started by a session fixture in a session of its own (as the broker fixture does), a
real SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
import subprocess, sys
from pathlib import Path
import pytest
sys.path.insert(0, {repo!r})
from tests.interrupt import install

def pytest_configure(config):
    install()

@pytest.fixture(scope="session")
def service():
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    Path("service.pid").write_text(str(proc.pid))
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        Path("torn-down").write_text("yes")
"""

TEST = """
import time
from pathlib import Path

def test_runs_until_stopped(service):
    Path("running").write_text("yes")
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_tears_the_fixtures_down(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST.format(repo=str(REPO)))
    (tmp_path / "test_stopped.py").write_text(TEST)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:timeout",
         str(tmp_path)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    service = None
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "running").exists():
            assert run.poll() is None, run.communicate()[0].decode()
            assert time.monotonic() < deadline, "the inner test never started"
            time.sleep(0.05)
        service = int((tmp_path / "service.pid").read_text())
        assert _alive(service)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0].decode()
        assert (tmp_path / "torn-down").exists(), output
        assert not _alive(service), output
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if service is not None and _alive(service):
            os.kill(service, signal.SIGKILL)
