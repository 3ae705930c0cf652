"""A smoke run of the gateway benchmark, so that it keeps working; its figures are not checked
here (timing targets belong to the benchmark, not to tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_the_gateway_benchmark_runs_and_writes_its_results(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "gateway.py"),
            "--quick",
            "--seconds",
            "2",
            "--soak",
            "3",
            "--bootstrap",
            kafka_bootstrap,
            "--out",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    latest = json.loads((tmp_path / "gateway-latest.json").read_text())
    assert latest["max_rate"]["gateway_rps"] > 0
    # --quick: 200 requests/s for 2 s counted on each path, after 0.5 s not counted (warm-up)
    assert latest["warmup_s"] == 0.5
    for path in ("gateway", "direct", "floor"):
        assert 0 < latest["latency_ms"][path]["n"] <= 400, latest["latency_ms"]
    health = latest["gateway_health"]
    answered = health["answered"]
    assert answered["trinity"] > 0 and answered["production"] > 0  # sampling:0.5 routes both ways
    assert health["publisher"]["published"] > 0
    assert "added p50" in result.stdout
    # the policy failing: each gateway fell back as it should, every request answered
    fallback = latest["fallback_ms"]
    assert fallback["refused"]["fallbacks"].get("connect", 0) > 0
    assert fallback["status_503"]["fallbacks"].get("status_5xx", 0) > 0
    assert fallback["breaker_open"]["breaker"] == "open"
    assert fallback["breaker_open"]["fallbacks"].get("breaker_open", 0) > 0
    for path in ("refused", "status_503", "breaker_open"):
        got = fallback[path]
        assert got["failed"] == 0 and got["fallback"]["n"] > 0 and got["production"]["n"] > 0
