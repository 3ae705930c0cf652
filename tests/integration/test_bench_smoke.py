"""A smoke run of the benchmark, so that it keeps working; its figures are not checked here
(timing targets belong to the benchmark, not to tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

pytestmark = pytest.mark.integration


def test_the_benchmark_runs_and_writes_its_results(kafka_bootstrap: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "run.py"), "--quick", "--only",
         "ceiling,pipeline", "--calls", "300", "--bootstrap", kafka_bootstrap, "--out",
         str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert latest["ceiling"]["events"] == 1500
    assert latest["pipeline"]["calls"] == 300
    assert (latest["pipeline"]["events_per_s"] or 0) > 0
    assert "pipeline / ceiling" in result.stdout
