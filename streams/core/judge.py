"""The LLM judge's rules: what it is asked, how its answer is read, and what a verdict is.

The built-in judge reward (:func:`streams.core.rewards.judge`) scores a trajectory with the
verdict of an LLM behind an OpenAI-compatible endpoint. The reward stage
(:class:`~streams.core.reward_join.RewardJoin`) asks for a verdict once per call with a
:class:`~streams.models.JudgeRequest` built here (:meth:`JudgeSpec.request`); the judge stage
of a runner sends it (``reward.judge`` settings, :mod:`streams.io.judge`) and turns the answer
into a :class:`~streams.models.JudgeVerdict` with :func:`verdict_of`; the reward stage keeps the
first verdict of every call and scores with it.

What the judge is sent: two chat messages, the rubric (the ``reward.judge.rubric_file``, as the
system message) and the trajectory rendered as text (:func:`render`: the prompt, every step, the
outcome; at most ``max_prompt_chars`` characters, the middle cut out and marked). The prompt
hash is the sha256 of ``rubric + "\\0" + prompt``: the same rubric and trajectory give the same
hash, whichever runner asks.

What the judge must answer (strict, so that a garbage answer is a clear dead letter, never a
guess): the message content is one JSON object, optionally inside a Markdown code fence, with
``"score"`` a number from 0 to 1 and optionally ``"reason"`` a string::

    {"score": 0.8, "reason": "answered the question, one needless tool call"}

Anything else (no JSON, another JSON value, no score, a score that is not a number or is out of
range) is a verdict without a score whose ``error`` names what was wrong; the reward stage makes
the call a dead letter with that reason. Such an answer is not retried (asking again would cost
as much and most likely fail alike); only an unavailable judge (5xx, 408, 429, a timeout, a
connection error) is, with backoff, until ``max_age`` after the request was made.

The judge stage (:class:`JudgeStage`) is the same for both runners: a request (decoded at the
edge, or handed over by replay) goes out over a :data:`JudgePort` (the runner asks the judge
over HTTP with the one retry loop, :func:`streams.io.judge.judge_port`, or a fake) and comes
back as one verdict for ``verdicts``; a process answers each call once.

May import: the standard library, :mod:`streams.models`, :mod:`streams.errors`,
:mod:`streams.envelope`, :mod:`streams.core.effects`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ..envelope import Envelope, misplaced
from ..errors import JudgeAnswerError, RecordError
from ..models import JudgeRequest, JudgeVerdict, StepKind, Trajectory
from .effects import Out, Reject

__all__ = [
    "JUDGED_REMEMBERED",
    "MAX_RAW_ANSWER",
    "JudgeAnswerError",
    "JudgePort",
    "JudgeSpec",
    "JudgeStage",
    "answer_content",
    "expired",
    "failed_verdict",
    "messages",
    "parse_score",
    "prompt_hash",
    "render",
    "verdict_of",
]

MAX_RAW_ANSWER = 8192
"""Characters of the judge's answer kept in a verdict."""

log = logging.getLogger("trajstream.judge")

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*)\n\s*```$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class JudgeSpec:
    """The judge of a deployment: its model, its rubric, and how much of a trajectory it sees."""

    model: str
    rubric: str
    max_prompt_chars: int = 20_000

    def request(self, trajectory: Trajectory, now: datetime) -> JudgeRequest:
        """The request for ``trajectory``, made at ``now``."""
        prompt = render(trajectory, self.max_prompt_chars)
        return JudgeRequest(
            call_id=trajectory.call_id,
            trajectory_id=trajectory.trajectory_id,
            model=self.model,
            rubric=self.rubric,
            prompt=prompt,
            prompt_hash=prompt_hash(self.rubric, prompt),
            requested_at=now,
        )


def prompt_hash(rubric: str, prompt: str) -> str:
    """sha256 (hex) of the rubric and the rendered prompt."""
    return hashlib.sha256(f"{rubric}\0{prompt}".encode()).hexdigest()


def messages(request: JudgeRequest) -> list[dict[str, str]]:
    """The chat messages of ``request``: the rubric as the system message, then the prompt."""
    return [
        {"role": "system", "content": request.rubric},
        {"role": "user", "content": request.prompt},
    ]


def render(trajectory: Trajectory, max_chars: int = 20_000) -> str:
    """The trajectory as the judge reads it: prompt, steps, outcome, at most ``max_chars``.

    A longer rendering keeps its first two thirds and its last third (the outcome) and says
    how much was cut in between.
    """
    lines = ["## Prompt"]
    lines += [f"{m.role}: {m.content}" for m in trajectory.input_messages] or ["(none)"]
    lines.append("## Steps")
    for i, step in enumerate(trajectory.steps, 1):
        if step.kind is StepKind.TOOL:
            lines.append(f"### {i}. tool {step.tool_name or '?'}")
            lines += [f"{m.role}: {m.content}" for m in step.output_messages]
            continue
        model = step.response_model or step.request_model or "?"
        lines.append(f"### {i}. LLM ({model})")
        for m in step.output_messages:
            if m.content:
                lines.append(f"{m.role}: {m.content}")
            for call in m.tool_calls:
                lines.append(f"{m.role} calls {call.name}({call.arguments})")
    if not trajectory.steps:
        lines.append("(none)")
    lines.append("## Outcome")
    status = trajectory.status.value if trajectory.status else "unknown"
    if trajectory.error_type:
        status += f" ({trajectory.error_type})"
    lines.append(f"status: {status}")
    lines.append(f"output: {trajectory.output or ''}")
    text = "\n".join(lines)
    if len(text) <= max_chars:
        return text
    marker = "\n[... {} characters cut ...]\n"
    room = max(0, max_chars - len(marker.format(len(text))))
    head, tail = room * 2 // 3, room - room * 2 // 3
    cut = len(text) - head - tail
    return text[:head] + marker.format(cut) + (text[-tail:] if tail else "")


def answer_content(body: Any) -> str:
    """The message content of an OpenAI chat completion (``choices[0].message.content``)."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeAnswerError(
            "garbage answer: not a chat completion (no choices[0].message.content)"
        ) from None
    if not isinstance(content, str):
        raise JudgeAnswerError("garbage answer: the message content is not text")
    return content


def parse_score(content: str) -> tuple[float, str]:
    """The score and reason of an answer in the documented format (see the module docstring).

    >>> parse_score('{"score": 0.5, "reason": "fine"}')
    (0.5, 'fine')
    """
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if not text:
        raise JudgeAnswerError("garbage answer: empty")
    try:
        data = json.loads(text)
    except ValueError:
        raise JudgeAnswerError(
            f'garbage answer: not JSON (expected {{"score": 0..1, "reason": ...}}): '
            f"{_snippet(text)}"
        ) from None
    if not isinstance(data, dict):
        raise JudgeAnswerError(f"garbage answer: a JSON {type(data).__name__}, not an object")
    if "score" not in data:
        raise JudgeAnswerError('garbage answer: no "score" in the JSON object')
    score = data["score"]
    if isinstance(score, bool) or not isinstance(score, int | float):
        raise JudgeAnswerError(f"garbage answer: the score {score!r} is not a number")
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        raise JudgeAnswerError(f"garbage answer: the score {score!r} is outside [0, 1]")
    reason = data.get("reason", "")
    return float(score), reason if isinstance(reason, str) else json.dumps(reason)


def verdict_of(
    request: JudgeRequest, body: Any, raw: str, attempts: int, now: datetime
) -> JudgeVerdict:
    """The verdict of an answer ``body`` (the parsed JSON; ``raw`` its text): scored, or an
    error naming what was wrong with it."""
    try:
        content = answer_content(body)
    except JudgeAnswerError as exc:
        return failed_verdict(request, str(exc), raw, attempts, now)
    try:
        score, reason = parse_score(content)
    except JudgeAnswerError as exc:
        return failed_verdict(request, str(exc), content, attempts, now)
    return JudgeVerdict(
        call_id=request.call_id,
        trajectory_id=request.trajectory_id,
        score=score,
        reason=reason[:MAX_RAW_ANSWER],
        judge_model=request.model,
        prompt_hash=request.prompt_hash,
        raw_answer=content[:MAX_RAW_ANSWER],
        attempts=attempts,
        requested_at=request.requested_at,
        judged_at=now,
    )


def failed_verdict(
    request: JudgeRequest, error: str, raw: str, attempts: int, now: datetime
) -> JudgeVerdict:
    """A verdict without a score: the call becomes a dead letter with ``error``."""
    return JudgeVerdict(
        call_id=request.call_id,
        trajectory_id=request.trajectory_id,
        error=error,
        judge_model=request.model,
        prompt_hash=request.prompt_hash,
        raw_answer=raw[:MAX_RAW_ANSWER],
        attempts=attempts,
        requested_at=request.requested_at,
        judged_at=now,
    )


def expired(request: JudgeRequest, now: datetime, max_age: timedelta) -> str | None:
    """Why ``request`` must not be sent any more (older than ``max_age``), or None."""
    age = now - request.requested_at
    if age > max_age:
        return (
            f"judge request not answered within reward.judge.max_age_s "
            f"({max_age.total_seconds():g}s; it is {age.total_seconds():.0f}s old)"
        )
    return None


def _snippet(text: str, n: int = 80) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= n else flat[:n] + "...")


JudgePort = Callable[[JudgeRequest], Awaitable[JudgeVerdict]]
"""How a runner asks the judge one request: until it answers or the request is older than
``reward.judge.max_age_s`` (the one retry loop), returning the verdict, scored or saying why not;
it never raises for what the judge answered."""

JUDGED_REMEMBERED = 100_000
"""Call ids the judge stage remembers having answered, to skip a request made again."""


class JudgeStage:
    """The judge stage: a :class:`~streams.models.JudgeRequest` -> the port -> its verdict on
    ``verdicts`` (scored or not: the reward stage makes one without a score a ``judge`` dead
    letter). A request made again for a redelivered trajectory is not asked twice by one
    process (the reward stage keeps the first verdict anyway); ``decline``: every request gets
    a verdict without a score saying so, and the judge is not asked (replay's
    ``reward.judge.replay_missing = dead_letter``)."""

    stage = "judge"

    def __init__(self, *, remember: int = JUDGED_REMEMBERED, decline: str | None = None) -> None:
        self.remember = remember
        self.decline = decline
        self._judged: OrderedDict[str, None] = OrderedDict()

    async def on_record(
        self, env: Envelope, ask: JudgePort, now: Callable[[], datetime]
    ) -> Out:
        out = Out()
        try:
            match env.open():
                case JudgeRequest() as request:
                    pass
                case other:
                    raise misplaced(other, env.topic)
        except RecordError as exc:
            out.reject(Reject.of(self.stage, exc, env.source))
            return out
        if request.call_id in self._judged:
            # made again for a redelivered trajectory; this process answered it already,
            # and the reward stage reads that verdict (after a restart it is asked again,
            # and the reward stage keeps the first verdict)
            out.stats["judge.skipped"] += 1
            return out
        if self.decline is not None:
            out.stats["judge.not_asked"] += 1
            verdict = failed_verdict(request, self.decline, "", 0, now())
        else:
            out.stats["judge.asked"] += 1
            verdict = await ask(request)
            if verdict.error is not None:
                log.warning("judge: no score for call %s: %s", verdict.call_id, verdict.error)
        out.stats["judge.verdicts" if verdict.error is None else "judge.failed"] += 1
        out.emit("verdicts", verdict.call_id.encode(), verdict)
        self._judged[request.call_id] = None
        while len(self._judged) > self.remember:
            self._judged.popitem(last=False)
        return out
