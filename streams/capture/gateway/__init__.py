"""The OpenAI-compatible gateway: routes selected calls to Trinity and records every step.

An agent goes behind it by changing its client's base URL to ``http://<gateway>/calls/<call_id>/v1``
(or ``http://<gateway>/v1`` for calls of one step). Routes:

=====================================  ====  ===================================================
``/v1/chat/completions``               POST  a call of one step (the gateway names it)
``/calls/{call_id}/v1/chat/completions`` POST  one step of the call ``call_id``
``/v1/models``, ``/calls/{id}/v1/models`` GET   the model list of the upstream that would answer
``/calls/{call_id}/end``               POST  ``{"status", "output", "error_type"}``: END
``/calls/{call_id}/feedback``          POST  rating, thumbs, correction or preference
``/healthz``                           GET   the gateway's and the publisher's state
=====================================  ====  ===================================================

Request headers (all optional): ``X-Trajstream-Agent-Name``, ``-Agent-Id``, ``-Agent-Version``,
``-Conversation-Id``, and ``X-Trajstream-Mark``: a JSON training mark (``{"labels": [...],
"task_id": "...", "run_id": 0, "metadata": {...}, "marked_at": "<ISO 8601>"}``, all optional).
Response headers: ``X-Trajstream-Call-Id``, ``X-Trajstream-Upstream`` (trinity or production),
``X-Trajstream-Selected``, ``X-Trajstream-Seq`` (the step's seq) and, when production answered a
request of a call routed to the policy, ``X-Trajstream-Fallback`` (why: :mod:`..fallback`).

Steps and their ``seq``: an LLM step's seq is the position of its answer in the conversation
(``len(messages)`` of its request); the ``tool`` messages that follow the last assistant message
of a request are TOOL steps at their own positions. So seq is the same on every replica, a
retried request keeps its seq (the workers keep the first), and seqs of one call never collide
while its requests extend one conversation. START is published the first time a process sees a
call (the workers keep the first START); END from ``/end`` carries the number of steps this
process recorded for the call (``gateway.count_steps``), so replicas must be sticky per call
(hash on the ``/calls/{call_id}`` path) or run with ``count_steps = false``.

The wiring: parse and validate (a bad request is an OpenAI-shaped 4xx and recorded nowhere),
decide the route (:mod:`.routing`), open Trinity's answer (or fall back to production), forward,
answer the agent, then queue the records on the
:class:`~.publisher.Publisher`, which never makes the agent wait for Kafka.

The package, one seam a module (each imports only those before it):

- :mod:`.requests`: a request's body, call id and START headers read and checked; error shapes;
- :mod:`.calls`: the call table (step seqs, shadow answers on their way), the counters;
- :mod:`.policy`: Trinity as an upstream that may fail: the fallback to production, the circuit
  breaker, the policy's version (pure parts: :mod:`..breaker`, :mod:`..fallback`,
  :mod:`..policy_version`);
- :mod:`.upstream`: the two upstreams and the one send every route uses (502, 504);
- :mod:`.state`: what every route shares (decision, publisher, the wait for the broker);
- :mod:`.chat_routes`: chat completions, JSON and streamed, and shadow mode;
- :mod:`.api_shapes`, :mod:`.api_routes`: the Responses and Messages APIs (translations in
  :mod:`streams.capture.apis`);
- :mod:`.app`: the aiohttp application, middleware, start and stop, models/end/feedback/health;
- :mod:`.build`: :func:`build_gateway` from the settings, :func:`run_gateway`.

The pure parts (OpenAI JSON to records, routing, the buffer) are in :mod:`..chat`,
:mod:`..routing` and :mod:`..publisher`.

May import: aiohttp, the models, settings, selection, :mod:`streams.io`, and its siblings in
``capture``.
"""

from __future__ import annotations

from ...errors import BadRequest
from .app import Gateway
from .build import build_gateway, check_gateway, run_gateway
from .calls import CallState, CallTable
from .requests import openai_error, parse_messages

__all__ = [
    "BadRequest",
    "CallState",
    "CallTable",
    "Gateway",
    "build_gateway",
    "check_gateway",
    "openai_error",
    "parse_messages",
    "run_gateway",
]

