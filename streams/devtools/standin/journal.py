"""The stand-in's journal: what a stand-in process keeps across a SIGKILL and a restart, as
Trinity keeps its experience rows in a database (``trajstream standin --journal FILE``).

One JSON line per event, appended and flushed as it happens (a SIGKILL of the process loses
nothing the kernel has): a served experience (``exp``), a ``/feedback`` as received and what it
rewarded (``fb``), a ``/commit`` and what it drained (``commit``), the model version set
(``version``). A stand-in started on the same file reads it first and is where the killed one
was: the same rows, rewards, ready rows, trained rows, explore step and model version.

One difference from Trinity, on purpose: Trinity keeps the rows that feedback made ready (and
not yet committed) in memory only, so a crash between a ``/feedback`` and the next
``/commit`` loses them; the journal keeps them, so that a test of the rest of the loop can
count each trained call exactly once across a restart.

May import: anything; a dev tool, never imported by the product.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from .state import CommitRecord, Experience, FeedbackRecord, StandInState

__all__ = ["Journal"]


class Journal:
    """An append-only file of the stand-in's events (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: IO[str] | None = None

    def load(self, state: StandInState) -> int:
        """Replay the file into ``state``; the number of events read (a torn last line, from a
        kill in the middle of a write, is left out)."""
        if not self.path.exists():
            return 0
        n = 0
        for line in self.path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            _apply(state, event)
            n += 1
        return n

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def truncate(self) -> None:
        """Forget everything (``/_standin/reset``)."""
        self.close()
        self.path.write_text("")
        self.open()

    def served(self, row: Experience) -> None:
        self._write({"t": "exp", **asdict(row)})

    def feedback(self, record: FeedbackRecord) -> None:
        self._write({"t": "fb", **_record(record)})

    def commit(self, record: CommitRecord, model_version: int) -> None:
        self._write({"t": "commit", **_record(record), "model_version": model_version})

    def version(self, model_version: int) -> None:
        self._write({"t": "version", "model_version": model_version})

    def _write(self, event: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(event, default=str) + "\n")
            self._fh.flush()


def _record(obj: FeedbackRecord | CommitRecord) -> dict[str, Any]:
    data = asdict(obj)
    data["received_at"] = obj.received_at.isoformat()
    return data


def _apply(state: StandInState, event: dict[str, Any]) -> None:
    kind = event.pop("t", None)
    if kind == "exp":
        served = Experience(**event)
        state.experiences[served.msg_id] = served
        state.request_count += 1
    elif kind == "fb":
        event["received_at"] = datetime.fromisoformat(event["received_at"])
        fed = FeedbackRecord(**event)
        state.feedback.append(fed)
        body = fed.body if isinstance(fed.body, dict) else {}
        for msg_id in fed.applied:
            row = state.experiences.get(msg_id)
            if row is None:
                continue
            row.reward, row.rewarded = float(body.get("reward", 0.0)), True
            row.task_id, row.run_id = body.get("task_id"), body.get("run_id", 0)
            state.ready.append(msg_id)
        state.ready_count_total += len(fed.applied)
    elif kind == "commit":
        version = event.pop("model_version", state.model_version)
        event["received_at"] = datetime.fromisoformat(event["received_at"])
        record = CommitRecord(**event)
        state.commits.append(record)
        if record.status == 200 and record.step is not None:
            drained = set(record.msg_ids)
            state.ready = [m for m in state.ready if m not in drained]
            for msg_id in record.msg_ids:
                if msg_id in state.experiences:
                    state.experiences[msg_id].committed_at_step = record.step
            state.trained.extend(record.msg_ids)
            state.explore_step = record.step
        state.model_version = version
    elif kind == "version":
        state.model_version = event["model_version"]
