"""The records of the gateway's hot path as plain data (jobs), built where they are encoded.

A chat request's START and its answered step are handed to the publisher as a *job*: a kind and
plain arguments (the request's bytes as the client sent them, the answer's bytes or dict, a few
strings and numbers), so the serving loop neither builds the pydantic records nor encodes them.
The publisher builds them later in the background (:class:`~.publisher.Publisher`) or in the
recorder process (:mod:`.recorder`); a job that cannot be built is logged and dropped there.

- ``start``: the call's START (the fields of the START the route was decided on, the request
  bytes its ``input_messages`` are read from): one record;
- ``step``: the LLM step of one request/answer pair, and for a call of one step
  (``/v1/chat/completions``) its END: one or two records.

May import: the models, :mod:`.chat`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..models import AgentCall, CallPhase, CallStatus, Completion
from .chat import llm_step, to_chat_message

__all__ = ["JOBS", "build_job", "one_step_end", "start_job", "step_job"]

Job = tuple[str, tuple[Any, ...]]
"""(kind, arguments): plain data, picklable"""


def one_step_end(step: Completion) -> AgentCall:
    """The END of a call of one step (``/v1/chat/completions``), made from its step."""
    return AgentCall(
        event_id=f"{step.call_id}/end",
        call_id=step.call_id,
        phase=CallPhase.END,
        event_time=step.event_time,
        status=CallStatus.OK,
        output=step.output_messages[0].content if step.output_messages else None,
        step_count=1,
    )


def _json(data: bytes | dict[str, Any]) -> dict[str, Any]:
    value = json.loads(data) if isinstance(data, bytes | bytearray) else data
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def start_job(start: AgentCall, raw_request: bytes) -> Job:
    """The job of a START decided on without its messages: they are read from the request."""
    fields = {k: v for k, v in start.__dict__.items() if k in start.model_fields_set}
    if start.attributes:  # the route's, added after it was made
        fields["attributes"] = start.attributes
    return "start", (fields, raw_request)


def _start(fields: dict[str, Any], raw_request: bytes) -> list[AgentCall]:
    messages = _json(raw_request)["messages"]
    fields["input_messages"] = [to_chat_message(m) for m in messages]
    return [AgentCall.model_validate(fields)]


def step_job(
    call_id: str,
    raw_request: bytes,
    answer: bytes | dict[str, Any],
    *,
    upstream: str,
    latency_ms: float,
    now: datetime,
    one_step: bool,
    marks: dict[str, Any] | None = None,
) -> Job:
    """The job of an answered step (and of its call's END when the call has one step);
    ``marks``: the step's ``policy_version``, ``fallback`` or ``error_type``, when any is set."""
    return "step", (call_id, raw_request, answer, upstream, latency_ms, now, marks, one_step)


def _step(
    call_id: str,
    raw_request: bytes,
    answer: bytes | dict[str, Any],
    upstream: str,
    latency_ms: float,
    now: datetime,
    marks: dict[str, Any] | None,
    one_step: bool,
) -> list[AgentCall | Completion]:
    step = llm_step(
        call_id, _json(raw_request), _json(answer), upstream=upstream, latency_ms=latency_ms,
        now=now, **(marks or {}),
    )  # fmt: skip
    return [step, one_step_end(step)] if one_step else [step]


def _nothing() -> list[Any]:
    raise ValueError("the record could not be made (see the gateway's log)")


JOBS: dict[str, Callable[..., list[Any]]] = {"start": _start, "step": _step, "none": _nothing}


def job_size(job: Job) -> int:
    """How many records ``job`` makes (each takes its place in the publisher's queue)."""
    kind, args = job
    return 2 if kind == "step" and args[-1] else 1


def build_job(job: Job) -> list[AgentCall | Completion]:
    """The records of ``job``; raises what building them raised."""
    kind, args = job
    return JOBS[kind](*args)
