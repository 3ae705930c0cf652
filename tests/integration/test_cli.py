"""The CLI as a user runs it: real processes, a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams.models import AgentCall, Completion, UserFeedback

from .conftest import REPO_ROOT, read_topic

pytestmark = pytest.mark.integration


def _run(
    args: list[str], env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.cli", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def env(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    return {
        **base,
        "TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "TRAJSTREAM_KAFKA__TOPIC_PREFIX": prefix,
        "TRAJSTREAM_DATA_DIR": str(tmp_path / "data"),
        "TRAJSTREAM_OBSERVE__PORT": "0",  # a worker started here never takes the fixed 9640
    }


@pytest.mark.parametrize("given", ["file", "directory"])
async def test_produce_publishes_a_valid_file_keyed_by_call_id(
    env, kafka_bootstrap, prefix, tmp_path, given
):
    example = REPO_ROOT / "examples" / "events.jsonl"
    if given == "directory":  # a directory: its .jsonl files
        (tmp_path / "in").mkdir()
        (tmp_path / "in" / "events.jsonl").write_bytes(example.read_bytes())
        (tmp_path / "in" / "notes.txt").write_text("not events", encoding="utf-8")
    result = _run(["produce", str(example if given == "file" else tmp_path / "in")], env)
    assert result.returncode == 0, result.stderr
    assert "published 6 event(s)" in result.stdout
    events = await read_topic(
        kafka_bootstrap, f"{prefix}.agent-events", until=lambda r: len(r) >= 5
    )
    feedback = await read_topic(
        kafka_bootstrap, f"{prefix}.user-feedback", until=lambda r: len(r) >= 1
    )
    assert [type(e) for e in events] == [AgentCall, Completion, Completion, Completion, AgentCall]
    assert [type(f) for f in feedback] == [UserFeedback]


async def test_produce_reports_every_invalid_line_and_publishes_nothing(
    env, tmp_path, kafka_bootstrap, prefix
):
    good = (REPO_ROOT / "examples" / "events.jsonl").read_text().splitlines()
    bad = [
        good[0],
        "{not json",
        json.dumps(
            {
                "type": "completion",
                "event_id": "e",
                "call_id": "c",
                "seq": -1,
                "event_time": "2026-01-01T00:00:00Z",
            }
        ),
        json.dumps(
            {
                "type": "agent_call",
                "event_id": "e",
                "call_id": "c",
                "phase": "START",
                "event_time": "2026-01-01T00:00:00",
            }
        ),
        json.dumps({"type": "gossip"}),
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(bad) + "\n")

    result = _run(["produce", str(path)], env)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "bad.jsonl:line" in line]
    assert [e.split(":")[1] for e in errors] == ["line 2", "line 3", "line 4", "line 5"]
    assert "seq" in errors[1] and "timezone" in errors[2] and "gossip" in errors[3]
    assert "nothing published" in result.stderr
    assert await read_topic(kafka_bootstrap, f"{prefix}.agent-events", timeout=3) == []

    result = _run(["produce", "--skip-invalid", str(path)], env)
    assert result.returncode == 0
    assert "published 1 event(s), skipped 4 invalid" in result.stdout


def test_a_bad_setting_fails_at_start_naming_it(env):
    result = _run(["worker"], {**env, "TRAJSTREAM_COMMIT__INTERVAL_S": "soon"}, timeout=60)
    assert result.returncode == 2
    assert "commit.interval_s [TRAJSTREAM_COMMIT__INTERVAL_S]" in result.stderr
    result = _run(["worker"], {**env, "TRAJSTREAM_SELECTION__STRATEGY": "most-popular"}, timeout=60)
    assert result.returncode == 2
    assert "unknown selection strategy 'most-popular'" in result.stderr


def test_the_demo_runs_and_agrees_with_the_standin(env):
    result = _run(["demo", "--calls", "30"], env, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "The summary agrees with what the stand-in received." in result.stdout
    assert "MISMATCH" not in result.stdout


# -- settings checked against reality at start (issue 14) ---------------------------------------


def test_a_replication_factor_above_the_broker_count_fails_naming_the_setting(env):
    result = _run(["topics"], {**env, "TRAJSTREAM_KAFKA__REPLICATION_FACTOR": "3"}, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "kafka.replication_factor is 3" in result.stderr
    assert "1 broker" in result.stderr
    assert "created" not in result.stdout


def test_a_faust_environment_variable_overriding_a_setting_stops_the_worker(env):
    result = _run(["worker"], {**env, "BROKER_URL": "kafka://elsewhere:9092"}, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "BROKER_URL would override kafka.bootstrap_servers" in result.stderr
