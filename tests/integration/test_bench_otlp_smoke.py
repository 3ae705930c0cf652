"""A smoke run of the OTLP ingest benchmark, so that it keeps working; its figures are not
checked here (timing targets belong to the benchmark, not to tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_the_otlp_benchmark_runs_and_writes_its_results(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "otlp.py"), "--quick", "--traces", "8",
         "--bootstrap", kafka_bootstrap, "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    latest = json.loads((tmp_path / "otlp.json").read_text())
    assert latest["spans_per_request"] == 32
    assert latest["throughput"]["spans"] == 32 * latest["throughput"]["requests"] > 0
    assert latest["latency"]["requests"] >= 10 and latest["latency"]["p99_ms"] > 0
    assert "spans/s ingested" in result.stdout
