"""A stand-in for a Trinity-RFT explorer in serve mode, for tests, demos and local runs.

:class:`StandIn` is an aiohttp server that answers the routes of
Trinity-RFT's serve mode the way Trinity does, without a model or a trainer:

- ``POST /v1/chat/completions`` serves an OpenAI chat completion with a fresh
  ``chatcmpl-<uuid hex>`` id, the request's ``model`` echoed, a short deterministic reply derived
  from the last user message, fake ``prompt_token_ids``/``token_ids``/``logprobs`` (Trinity forces
  those on) and ``usage``; it stores one experience row per completion, keyed by the id.
  ``"stream": true`` answers server-sent events (a role chunk, a content chunk, a finish chunk,
  ``data: [DONE]``) with one id and stores the row likewise (a final usage chunk when
  ``stream_options.include_usage``). When the request offers ``tools`` and its last message is
  not a ``tool`` result, the answer is a call of the first tool (``finish_reason
  "tool_calls"``, arguments ``{"query": <last user text>}``; streamed as OpenAI does, id and
  name first, then the arguments in pieces), so a simulated agent loop calls one tool and then
  answers. It serves as a production model as well (``StandIn(model="production")``). A body
  without a ``messages`` list answers 400
  ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``.
- ``GET /v1/models``, ``GET /health`` (empty 200) and ``GET /metrics`` (Trinity's five keys; as
  in Trinity, ``rollout/ready_experience_count`` counts every experience ever made ready).
- ``POST /feedback`` with Trinity's exact 400 bodies; it rewards rows that exist and were not
  rewarded before and queues them ready; unknown ids and repeats answer 200 and do nothing.
  Unlike Trinity, a bool ``reward`` is "not a number" (Trinity's ``isinstance`` accepts it).
- ``POST /commit`` (body ignored) drains the ready rows into ``trained`` and advances the
  explore step by one, even when nothing is ready.

A body that is not JSON (or not a JSON object) answers 400 ``{"detail": "Invalid JSON: ..."}``,
the shape Trinity's chat route uses; Trinity's ``/feedback`` would answer a bare 500 instead.

It also serves as an LLM judge (the ``reward.judge`` settings: ``url = <stand-in>/judge/v1``):
``POST /judge/v1/chat/completions`` answers ``{"score": s, "reason": ...}`` as the message
content, ``s`` derived from the sha256 of the request's last user message (so the same
trajectory always gets the same score), and records every request (``judge`` in the state,
``judge_requests``/``judge_ok`` in ``/_standin/counts``; the ``x-trajstream-call-id`` header
names the call). ``POST /_standin/judge`` steers it, without touching the Trinity routes::

    {"mode": "ok"}
    {"mode": "garbage", "count": 1}                next answer is prose, not the JSON asked for
    {"mode": "error", "status": 503, "count": 2}   next 2 judge requests answer 503

For tests and people, ``/_standin/`` routes expose and steer it: ``GET /_standin/state`` (every
``/feedback`` body as received and every ``/commit``, in order, with monotonic timestamps; the
experience rows; the explore step; the fault), ``POST /_standin/reset`` and
``POST /_standin/fault`` with one of::

    {"mode": "ok"}
    {"mode": "error", "status": 503, "count": 5}   next 5 /feedback or /commit answer 503
    {"mode": "slow", "delay": 2.0, "count": 10}    next 10 sleep 2 s, then are served normally
    {"mode": "down", "seconds": 30}                listening socket closed for 30 s

``count`` may be omitted or null: the fault then lasts until changed. A slow request is applied
after its delay even if the client gave up waiting, as a real server would. ``down`` also closes
the open keep-alive connections, so clients see connection errors, and it cannot be lifted over
HTTP (nothing listens): it ends after ``seconds``, or in process via :meth:`StandIn.set_fault`.
Faults never affect ``/_standin/`` routes or the chat, models, health and metrics routes
(except ``down``, which affects everything).

Faults of the chat route alone (a Trinity that fails while its other routes answer, see
:class:`ChatFault`): ``POST /_standin/chat-fault`` with one of::

    {"mode": "ok"}
    {"mode": "error", "status": 503, "retry_after": 5}   503 with Retry-After: 5
    {"mode": "error", "status": 429, "count": 3}          the next 3 answer 429
    {"mode": "slow", "delay": 12}                         first byte after 12 s
    {"mode": "hang"}                                      nothing, until the fault changes
    {"mode": "cut", "after": 2}                           a stream dropped after 2 chunks

The model version (``rollout/model_0/model_version`` of ``/metrics``, stored on each
experience row as Trinity does) is set with ``POST /_standin/version {"model_version": n}``,
and with ``StandIn(sync_interval=n)`` (``trajstream standin --sync-interval n``) every n-th
``/commit`` advances it by one, as Trinity's explorer syncs new weights every
``synchronizer.sync_interval`` steps. ``StandIn(journal=path)`` (``--journal``) keeps what it
served, rewarded and committed in an append-only file and reads it back at start
(:mod:`~streams.devtools.standin.journal`), so a stand-in process killed and started again
goes on where it was.

The package: :mod:`~streams.devtools.standin.server` (:class:`StandIn`, its lifecycle and
socket, :func:`run`), :mod:`~streams.devtools.standin.routes` (the route handlers) and
:mod:`~streams.devtools.standin.state` (what it holds, the fault switches); every public name is
re-exported here.

May import: anything; a dev tool, never imported by the product (core, runtime, io, capture).
"""

from __future__ import annotations

from .server import StandIn, fetch_state, reset_state, run, set_chat_fault, set_fault
from .state import (
    ChatFault,
    CommitRecord,
    Experience,
    Fault,
    FaultMode,
    FeedbackRecord,
    JudgeCall,
    JudgeFault,
    StandInState,
    judge_score,
)

__all__ = [
    "ChatFault",
    "CommitRecord",
    "Experience",
    "Fault",
    "FaultMode",
    "FeedbackRecord",
    "JudgeCall",
    "JudgeFault",
    "StandIn",
    "StandInState",
    "fetch_state",
    "judge_score",
    "reset_state",
    "run",
    "set_chat_fault",
    "set_fault",
]
