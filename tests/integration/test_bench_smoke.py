"""A smoke run of the benchmark, so that it keeps working; its figures are not checked here
(timing targets belong to the benchmark, not to tests), only that each scenario ran, wrote every
key it reports, and that the table has a verdict row for each figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.long]

SCENARIO_KEYS = {
    "ceiling": {"events", "seconds", "events_per_s"},
    "pipeline": {"workers", "calls", "events", "seconds", "events_per_s", "rss_kib"},
    "memory": {
        "events_per_call",
        "open_calls",
        "rss_before_kib",
        "rss_after_kib",
        "payload_bytes_per_open",
        "rss_bytes_per_open",
        "rss_overhead_bytes_per_open",
        "seconds_to_consume",
    },
    "changelog": {
        "steps",
        "calls",
        "events",
        "input_bytes",
        "changelog_bytes",
        "changelog_records",
        "produced_bytes",
        "produced_records",
        "changelog_per_input_byte",
        "produced_per_input_byte",
        "seconds_to_process",
        "topics",
    },
    "scaling": {
        "workers",
        "calls",
        "events",
        "seconds_to_drain",
        "seconds_to_produce",
        "events_per_s",
        "cpu_s_per_worker",
        "cpu_s_per_1000_events",
        "rss_kib",
    },
    "soak": {
        "seconds",
        "warmup_seconds",
        "events_per_s_offered",
        "calls",
        "calls_fed_back",
        "rss_first_kib",
        "rss_last_kib",
        "rss_peak_kib",
        "drift_pct",
        "slope_kib_per_hour",
        "slope_pct_per_hour",
        "samples",
    },
}


def test_the_benchmark_runs_and_writes_its_results(kafka_bootstrap: str, tmp_path: Path) -> None:
    only = "ceiling,pipeline,memory,changelog,scaling,soak"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "run.py"),
            "--quick",
            "--only",
            only,
            "--calls",
            "200",
            "--open-calls",
            "200",
            "--changelog-calls",
            "20",
            "--soak-seconds",
            "3",
            "--scale-workers",
            "1,2",
            "--bootstrap",
            kafka_bootstrap,
            "--out",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    latest = json.loads((tmp_path / "latest.json").read_text())

    assert {"date", "machine", "quick", "partitions", "scenarios", "durations_s", "verdicts"} <= (
        latest.keys()
    )
    assert {"cores", "ram_gib", "python", "kafka", "arch"} <= latest["machine"].keys()
    assert latest["scenarios"] == only.split(",")
    assert set(latest["durations_s"]) == set(only.split(","))

    assert SCENARIO_KEYS["ceiling"] <= latest["ceiling"].keys()
    assert latest["ceiling"]["events"] == 1000
    assert SCENARIO_KEYS["pipeline"] <= latest["pipeline"].keys()
    assert latest["pipeline"]["calls"] == 200
    assert (latest["pipeline"]["events_per_s"] or 0) > 0
    assert set(latest["memory"]) == {"events_1", "events_10"}
    for name, events in (("events_1", 1), ("events_10", 10)):
        shape = latest["memory"][name]
        assert SCENARIO_KEYS["memory"] <= shape.keys()
        assert shape["events_per_call"] == events
        assert shape["rss_after_kib"] > 0
    assert set(latest["changelog"]) == {"steps_5", "steps_100"}
    for name, steps in (("steps_5", 5), ("steps_100", 100)):
        shape = latest["changelog"][name]
        assert SCENARIO_KEYS["changelog"] <= shape.keys()
        assert shape["steps"] == steps
        assert shape["events"] == shape["calls"] * (steps + 2)
        # the worker wrote changelog records (whatever its tables are called) and more
        assert any(t.endswith("-changelog") for t in shape["topics"])
        assert 0 < shape["changelog_bytes"] <= shape["produced_bytes"]
    # two counts keep the smoke run short; the benchmark compares 1, 2 and 4
    assert set(latest["scaling"]) == {"workers_1", "workers_2"}
    for name, n in (("workers_1", 1), ("workers_2", 2)):
        run = latest["scaling"][name]
        assert SCENARIO_KEYS["scaling"] <= run.keys()
        assert len(run["cpu_s_per_worker"]) == n
        assert run["cpu_s_per_1000_events"] > 0
    assert SCENARIO_KEYS["soak"] <= latest["soak"].keys()
    assert latest["soak"]["samples"]

    rows = {v["measure"]: v for v in latest["verdicts"]}
    expected_rows = [
        "pipeline / aiokafka ceiling",
        "RSS per open call of 1 event(s) beyond payload",
        "RSS per open call of 10 event(s) beyond payload",
        "changelog bytes per input byte, 5-step calls",
        "changelog bytes per input byte, 100-step calls",
        "all bytes produced per input byte, 5-step calls",
        "worker CPU s per 1,000 events, 1/2 workers",
        "throughput, two workers / one (2 shared cores)",
    ]
    for measure in expected_rows:
        assert measure in rows, sorted(rows)
        assert rows[measure]["met"] in {"met", "NOT met", "context"}
    assert any(m.startswith("RSS drift over") for m in rows)
    assert "pipeline / aiokafka ceiling" in result.stdout
