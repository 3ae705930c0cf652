"""The stand-in's state: what it served, received and committed, and its fault switches (the
dataclasses ``GET /_standin/state`` shows), and the judge's score of a prompt.

May import: anything; a dev tool, never imported by the product.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, cast

__all__ = [
    "ChatFault",
    "CommitRecord",
    "Experience",
    "Fault",
    "FaultMode",
    "FeedbackRecord",
    "JudgeCall",
    "JudgeFault",
    "StandInState",
    "judge_score",
]


FaultMode = Literal["ok", "error", "slow", "down"]


_FAULT_MODES: Final = ("ok", "error", "slow", "down")


_MAX_TASK_ID_LENGTH: Final = 64


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Experience:
    """One served chat completion, as Trinity stores it (minus real tokens)."""

    msg_id: str
    model: str
    prompt: str
    completion: str
    served_at: float
    reward: float | None = None
    task_id: Any = None
    run_id: Any = None
    rewarded: bool = False
    committed_at_step: int | None = None
    """Explore step reached by the commit that drained this row into training."""
    model_version: int = 0
    """The model version that served it (as Trinity stores it in the row's info)."""


@dataclass
class FeedbackRecord:
    """One ``POST /feedback`` as received, whatever was answered."""

    at: float
    """``time.monotonic()`` on arrival (comparable across processes on one host)."""
    received_at: datetime
    body: Any
    """The parsed JSON body, or the raw text when it was not JSON."""
    status: int | None = None
    """The status answered; None while the request is still being served (slow fault)."""
    applied: list[str] = field(default_factory=list)
    """The msg_ids this request rewarded (served before and not rewarded yet)."""
    violations: list[str] = field(default_factory=list)
    """Contract breaches Trinity accepts silently (e.g. a 65-character task_id)."""


@dataclass
class CommitRecord:
    """One ``POST /commit`` as received."""

    at: float
    received_at: datetime
    status: int | None = None
    drained: int = 0
    step: int | None = None
    """The explore step after this commit; None if it was not applied."""
    msg_ids: list[str] = field(default_factory=list)


@dataclass
class Fault:
    """The injected fault; ``count`` is how many more requests it affects (None: no limit)."""

    mode: FaultMode = "ok"
    status: int = 503
    delay: float = 0.0
    count: int | None = None
    seconds: float = 0.0
    until: float | None = None
    """For ``down``: ``time.monotonic()`` when the server listens again."""

    @classmethod
    def from_json(cls, data: Any) -> Fault:
        """Build a fault from its JSON form; raises ValueError saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("fault must be a JSON object")
        mode = data.get("mode")
        if mode not in _FAULT_MODES:
            raise ValueError(f"mode must be one of {', '.join(_FAULT_MODES)}")
        count = data.get("count")
        if count is not None and (not _is_int(count) or count < 1):
            raise ValueError("count must be a positive integer or null")
        fault = cls(mode=cast(FaultMode, mode), count=count)
        if mode == "error":
            status = data.get("status", 503)
            if not _is_int(status) or not 400 <= status <= 599:
                raise ValueError("status must be an integer from 400 to 599")
            fault.status = status
        elif mode == "slow":
            fault.delay = _non_negative(data.get("delay", 1.0), "delay")
        elif mode == "down":
            fault.seconds = _non_negative(data.get("seconds", 5.0), "seconds")
            fault.count = None
        return fault

    def to_json(self) -> dict[str, Any]:
        """The JSON form, with only the fields that matter for the mode."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.mode == "error":
            out.update(status=self.status, count=self.count)
        elif self.mode == "slow":
            out.update(delay=self.delay, count=self.count)
        elif self.mode == "down":
            out.update(seconds=self.seconds, until=self.until)
        return out


ChatFaultMode = Literal["ok", "error", "slow", "hang", "cut"]

_CHAT_FAULT_MODES: Final = ("ok", "error", "slow", "hang", "cut")


@dataclass
class ChatFault:
    """How the chat route answers its next ``count`` requests (None: until changed); the other
    routes are not affected (``down``, of :class:`Fault`, takes every route down).

    - ``error``: ``status`` (default 503) with an OpenAI-shaped error body, and a
      ``Retry-After: <retry_after>`` header when ``retry_after`` is set;
    - ``slow``: the first byte after ``delay`` seconds, then the answer as usual;
    - ``hang``: nothing at all, until the fault is changed (then the connection is dropped);
    - ``cut``: a streamed answer stops after ``after`` chunks (0: after its headers) and the
      connection is dropped; a non-streamed one is dropped before any byte.

    ``slow`` and ``cut`` store the experience as a served request does (the model generated
    it); ``error`` and ``hang`` store nothing."""

    mode: ChatFaultMode = "ok"
    status: int = 503
    retry_after: str | None = None
    delay: float = 0.0
    after: int = 0
    count: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> ChatFault:
        """Build one from its JSON form; raises ValueError saying what is wrong."""
        if not isinstance(data, dict) or data.get("mode") not in _CHAT_FAULT_MODES:
            raise ValueError(f"mode must be one of {', '.join(_CHAT_FAULT_MODES)}")
        count = data.get("count")
        if count is not None and (not _is_int(count) or count < 1):
            raise ValueError("count must be a positive integer or null")
        fault = cls(mode=cast(ChatFaultMode, data["mode"]), count=count)
        status = data.get("status", 503)
        if not _is_int(status) or not 400 <= status <= 599:
            raise ValueError("status must be an integer from 400 to 599")
        fault.status = status
        retry = data.get("retry_after")
        if retry is not None:
            if _is_number(retry):
                retry = str(_non_negative(retry, "retry_after")).removesuffix(".0")
            elif not isinstance(retry, str) or not retry.strip():
                raise ValueError("retry_after must be seconds or an HTTP date")
            fault.retry_after = retry
        fault.delay = _non_negative(data.get("delay", 0.0), "delay")
        after = data.get("after", 0)
        if not _is_int(after) or after < 0:
            raise ValueError("after must be a non-negative integer")
        fault.after = after
        return fault

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class JudgeCall:
    """One ``POST /judge/v1/chat/completions`` as received."""

    at: float
    call_id: str | None
    """The ``x-trajstream-call-id`` header."""
    status: int
    score: float | None = None
    """The score answered (None: an error or a garbage answer)."""
    garbage: bool = False


@dataclass
class JudgeFault:
    """How the judge answers the next ``count`` requests (None: until changed)."""

    mode: Literal["ok", "garbage", "error"] = "ok"
    status: int = 503
    count: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> JudgeFault:
        if not isinstance(data, dict) or data.get("mode") not in ("ok", "garbage", "error"):
            raise ValueError("mode must be one of ok, garbage, error")
        count, status = data.get("count"), data.get("status", 503)
        if count is not None and (not _is_int(count) or count < 1):
            raise ValueError("count must be a positive integer or null")
        if not _is_int(status) or not 400 <= status <= 599:
            raise ValueError("status must be an integer from 400 to 599")
        return cls(mode=data["mode"], status=status, count=count)


def judge_score(text: str) -> float:
    """The stand-in judge's score of a prompt: from its sha256, in [0, 1], 3 decimals."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 1001 / 1000


@dataclass
class StandInState:
    """Everything the stand-in knows; tests in the same process read it directly."""

    experiences: dict[str, Experience] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    """Rewarded msg_ids waiting for the next commit."""
    trained: list[str] = field(default_factory=list)
    """msg_ids drained by commits, in order."""
    feedback: list[FeedbackRecord] = field(default_factory=list)
    commits: list[CommitRecord] = field(default_factory=list)
    explore_step: int = 0
    request_count: int = 0
    ready_count_total: int = 0
    model_version: int = 0
    fault: Fault = field(default_factory=Fault)
    chat_fault: ChatFault = field(default_factory=ChatFault)
    chat_faulted: int = 0
    """Chat requests a chat fault answered (or dropped)."""
    judge: list[JudgeCall] = field(default_factory=list)
    judge_fault: JudgeFault = field(default_factory=JudgeFault)

    def metrics(self) -> dict[str, int]:
        """The ``/metrics`` JSON, with Trinity's keys for its single model."""
        return {
            "rollout/model_0/total_request_count": self.request_count,
            "rollout/model_0/model_version": self.model_version,
            "rollout/total_experience_count": len(self.experiences),
            "rollout/ready_experience_count": self.ready_count_total,
            "explore_step_num": self.explore_step,
        }

    def to_json(self) -> dict[str, Any]:
        """The ``/_standin/state`` JSON (datetimes as ISO 8601 strings)."""

        def record(obj: FeedbackRecord | CommitRecord) -> dict[str, Any]:
            data = asdict(obj)
            data["received_at"] = obj.received_at.isoformat()
            return data

        return {
            "explore_step": self.explore_step,
            "model_version": self.model_version,
            "fault": self.fault.to_json(),
            "chat_fault": self.chat_fault.to_json(),
            "chat_faulted": self.chat_faulted,
            "metrics": self.metrics(),
            "feedback": [record(r) for r in self.feedback],
            "commits": [record(c) for c in self.commits],
            "experiences": [asdict(e) for e in self.experiences.values()],
            "ready": list(self.ready),
            "trained": list(self.trained),
            "judge": [asdict(j) for j in self.judge],
            "judge_fault": asdict(self.judge_fault),
        }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _non_negative(value: Any, name: str) -> float:
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number")
    return float(value)
