"""Dataset export: rewarded trajectories as fine-tuning files, with a manifest to trace them.

Three JSON-lines files, built by pure functions from trajectories and their rewards:

- ``trajectories.jsonl``: every rewarded trajectory, ``{"trajectory": ..., "reward": ...}``
  (the :class:`~streams.models.Trajectory` and :class:`~streams.models.RewardedTrajectory`
  records as JSON).
- ``sft.jsonl``: OpenAI chat fine-tuning rows, ``{"messages": [...]}``, from trajectories whose
  reward passes a threshold (:func:`sft_row`), and from CORRECTION feedback: the prompt, then
  the user's correction as the answer (:func:`correction_sft_rows`).
- ``dpo.jsonl``: OpenAI preference fine-tuning rows, ``{"input": {"messages": [...]},
  "preferred_output": [...], "non_preferred_output": [...]}``, from PREFERENCE feedback
  (:func:`preference_pairs`), from CORRECTION feedback (the correction preferred over the
  output it corrects, :func:`correction_pairs`) and from reward ranking of trajectories that
  share a prompt (:func:`ranking_pairs`).

Exact duplicate rows are removed (:func:`dedupe`). Every row is validated against its format
(:class:`SftRow`, :class:`DpoRow`) before it is written. Files are written to a temporary name
in the target directory and renamed into place only when all of them are complete
(:func:`write_export`), so a failure leaves nothing half-written; ``manifest.json`` is renamed
last and lists, per file, its row count, checksum and a trace of every row back to its call.

Tool calls: a step recorded with structured tool calls (``Completion.tool_call_details``, as the
gateway records them) is written with their real ids, names and JSON arguments, and a tool step
answers the call its ``tool_call_id`` names. Older records have names only
(``Completion.tool_calls``): an SFT row then gives each one a synthetic id (``call_<seq>_<n>``)
and ``"{}"`` as arguments unless the recorded entry is itself a JSON object with ``name`` and
``arguments``.

The rows' formats are in :mod:`streams.export.formats`, the writing in
:mod:`streams.export.files`; both are re-exported here.

May import: pydantic, the top-level modules.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence

from ..errors import ExportError
from ..models import (
    ChatMessage,
    Completion,
    FeedbackKind,
    RewardedTrajectory,
    StepKind,
    Trajectory,
    UserFeedback,
)
from .files import ExportFile, check_writable, write_export
from .formats import DpoRow, Pair, Row, SftRow, canonical

__all__ = [
    "EXPORT_SCHEMA_VERSION",
    "DpoRow",
    "ExportError",
    "ExportFile",
    "Pair",
    "Row",
    "SftRow",
    "canonical",
    "check_writable",
    "correction_pairs",
    "correction_sft_rows",
    "dedupe",
    "preference_pairs",
    "ranking_pairs",
    "sft_messages",
    "sft_row",
    "trajectory_row",
    "write_export",
]


EXPORT_SCHEMA_VERSION = 1
"""Version of the export files' layout and of the manifest; bumped when either changes."""


def trajectory_row(trajectory: Trajectory, rewarded: RewardedTrajectory) -> Row:
    """A line of ``trajectories.jsonl``."""
    return {
        "trajectory": trajectory.model_dump(mode="json"),
        "reward": rewarded.model_dump(mode="json"),
    }


def _message(m: ChatMessage) -> Row:
    out: Row = {"role": m.role, "content": m.content}
    if m.name:
        out["name"] = m.name
    return out


def _assistant_text(step: Completion) -> str:
    texts = [m.content for m in step.output_messages if m.role == "assistant" and m.content]
    if not texts:
        texts = [m.content for m in step.output_messages if m.content]
    return "\n".join(texts)


def _tool_call(step: Completion, n: int, recorded: str) -> Row:
    name, arguments = recorded, "{}"
    with contextlib.suppress(ValueError):
        data = json.loads(recorded)
        if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"]:
            name = data["name"]
            args = data.get("arguments", {})
            arguments = args if isinstance(args, str) else json.dumps(args, sort_keys=True)
    return {
        "id": f"call_{step.seq}_{n}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def sft_messages(trajectory: Trajectory) -> list[Row]:
    """The conversation of a trajectory in OpenAI's chat format.

    The call's input messages (earlier assistant turns with ``weight: 0``: context, not output
    to learn; input tool messages are left out, having no tool call ids), then per step in
    ``seq`` order: an LLM step's assistant output (with the tool calls it asked for), a tool
    step's ``tool`` message (answering the oldest open tool call of that name, else one added
    to the assistant turn before it), and finally the call's output as the last assistant
    message unless the last step already said it.
    """
    messages: list[Row] = []
    for m in trajectory.input_messages:
        if m.role in ("system", "developer", "user"):
            messages.append(_message(m))
        elif m.role == "assistant" and m.content:
            # earlier turns of the conversation: context, not this call's output to learn
            messages.append({**_message(m), "weight": 0})
    open_calls: list[tuple[str, str]] = []  # (tool name, id) asked for and not yet answered
    for step in trajectory.steps:
        if step.kind is StepKind.LLM:
            text = _assistant_text(step)
            calls = (
                [
                    {
                        "id": c.id or f"call_{step.seq}_{n}",
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for n, c in enumerate(step.tool_call_details)
                ]
                if step.tool_call_details
                else [_tool_call(step, n, name) for n, name in enumerate(step.tool_calls) if name]
            )
            if not text and not calls:
                continue
            msg: Row = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = calls
                open_calls.extend((c["function"]["name"], c["id"]) for c in calls)
            messages.append(msg)
            continue
        name = step.tool_name or "tool"
        call_id = next((cid for _, cid in open_calls if cid == step.tool_call_id), None)
        if call_id is None:
            call_id = next((cid for n, cid in open_calls if n == name), None)
        if call_id is None and open_calls and not step.tool_name:
            call_id = open_calls[0][1]
        if call_id is None:  # a tool step no recorded LLM step asked for
            call_id = f"call_{step.seq}_0"
            call: Row = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "weight" not in last:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            open_calls = [(n, cid) for n, cid in open_calls if cid != call_id]
        content = "\n".join(m.content for m in step.output_messages if m.content)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    final = trajectory.output
    last = messages[-1] if messages else None
    if final and not (
        last is not None
        and last["role"] == "assistant"
        and last.get("content") == final
        and not last.get("tool_calls")
    ):
        messages.append({"role": "assistant", "content": final})
    return messages


def sft_row(trajectory: Trajectory) -> Row | None:
    """The SFT row of a trajectory, or None when it has nothing valid to train on."""
    row = {"messages": sft_messages(trajectory)}
    try:
        SftRow.model_validate(row)
    except ValueError:
        return None
    return row


def _prompt_before(trajectory: Trajectory, step: Completion) -> list[Row]:
    """What the model saw when it produced ``step``: the step's own input messages when it
    recorded them, else the conversation up to that step."""
    if step.input_messages:
        return [_message(m) for m in step.input_messages]
    earlier = trajectory.model_copy(
        update={"steps": [s for s in trajectory.steps if s.seq < step.seq], "output": None}
    )
    return [{k: v for k, v in m.items() if k != "weight"} for m in sft_messages(earlier)]


def _pair_row(prompt: list[Row], chosen: str, rejected: str) -> Row | None:
    row = {
        "input": {"messages": prompt},
        "preferred_output": [{"role": "assistant", "content": chosen}],
        "non_preferred_output": [{"role": "assistant", "content": rejected}],
    }
    try:
        DpoRow.model_validate(row)
    except ValueError:
        return None
    return row


def preference_pairs(trajectory: Trajectory, feedback: Iterable[UserFeedback]) -> list[Pair]:
    """DPO rows from PREFERENCE feedback on a call's responses.

    The preferred response (``preferred_response_id``) is paired with the feedback's
    ``response_id`` when that names another response of the call; otherwise with every other
    response of the call that answered the same recorded input messages. The prompt is that of
    the earlier of the two responses.
    """
    llm = {s.response_id: s for s in trajectory.steps if s.kind is StepKind.LLM and s.response_id}
    pairs: list[Pair] = []
    for fb in feedback:
        if fb.kind is not FeedbackKind.PREFERENCE or fb.preferred_response_id not in llm:
            continue
        good = llm[fb.preferred_response_id]
        if fb.response_id and fb.response_id != good.response_id and fb.response_id in llm:
            others = [llm[fb.response_id]]
        elif good.input_messages:
            others = [
                s
                for rid, s in llm.items()
                if rid != good.response_id and s.input_messages == good.input_messages
            ]
        else:
            others = []
        for bad in others:
            first = good if good.seq <= bad.seq else bad
            row = _pair_row(
                _prompt_before(trajectory, first), _assistant_text(good), _assistant_text(bad)
            )
            if row is not None:
                pairs.append(
                    Pair(
                        row,
                        {
                            "source": "preference",
                            "call_id": trajectory.call_id,
                            "feedback_event_id": fb.event_id,
                            "preferred_response_id": good.response_id,
                            "rejected_response_id": bad.response_id,
                        },
                    )
                )
    return pairs


def _corrected_step(trajectory: Trajectory, fb: UserFeedback) -> Completion | None:
    """The LLM step a correction replaces: the one its ``response_id`` names, else the last
    LLM step that said something (the call's answer)."""
    llm = [s for s in trajectory.steps if s.kind is StepKind.LLM]
    named = next((s for s in llm if fb.response_id and s.response_id == fb.response_id), None)
    if named is not None:
        return named
    return next((s for s in reversed(llm) if _assistant_text(s)), None)


def _corrections(trajectory: Trajectory, feedback: Iterable[UserFeedback]) -> list[Row]:
    """Per CORRECTION feedback with text: the prompt, the model's text and the correction."""
    out: list[Row] = []
    for fb in feedback:
        text = (fb.correction or "").strip()
        if fb.kind is not FeedbackKind.CORRECTION or not text:
            continue
        step = _corrected_step(trajectory, fb)
        if step is not None:
            prompt, rejected, rid = (
                _prompt_before(trajectory, step),
                _assistant_text(step),
                (step.response_id),
            )
        else:  # no recorded LLM output: the call's input and output
            prompt = [_message(m) for m in trajectory.input_messages]
            rejected, rid = trajectory.output or "", None
        out.append(
            {
                "prompt": prompt,
                "rejected": rejected,
                "correction": text,
                "trace": {
                    "source": "correction",
                    "call_id": trajectory.call_id,
                    "feedback_event_id": fb.event_id,
                    "corrected_response_id": rid,
                },
            }
        )
    return out


def correction_pairs(trajectory: Trajectory, feedback: Iterable[UserFeedback]) -> list[Pair]:
    """DPO rows from CORRECTION feedback: the user's correction preferred over the model's
    output it corrects (the step its ``response_id`` names, else the call's last answer), with
    the prompt the model saw then. A correction equal to the output, or of an output with no
    text, makes no row."""
    pairs = []
    for c in _corrections(trajectory, feedback):
        row = _pair_row(c["prompt"], c["correction"], c["rejected"])
        if row is not None:
            pairs.append(Pair(row, c["trace"]))
    return pairs


def correction_sft_rows(trajectory: Trajectory, feedback: Iterable[UserFeedback]) -> list[Pair]:
    """SFT rows from CORRECTION feedback: the prompt the corrected output answered, then the
    correction as the assistant's answer (whatever the trajectory's reward: a person wrote it)."""
    rows = []
    for c in _corrections(trajectory, feedback):
        row = {"messages": [*c["prompt"], {"role": "assistant", "content": c["correction"]}]}
        try:
            SftRow.model_validate(row)
        except ValueError:
            continue
        rows.append(Pair(row, c["trace"]))
    return rows


def _final_text(trajectory: Trajectory) -> str:
    if trajectory.output:
        return trajectory.output
    for step in reversed(trajectory.steps):
        if step.kind is StepKind.LLM and (text := _assistant_text(step)):
            return text
    return ""


def ranking_pairs(
    scored: Iterable[tuple[Trajectory, RewardedTrajectory]], margin: float
) -> list[Pair]:
    """DPO rows from trajectories that share a prompt (equal input messages): the output of the
    highest-rewarded one preferred to that of the lowest, when their rewards differ by at least
    ``margin`` (ties broken by call id, so the result does not depend on input order)."""
    groups: dict[str, list[tuple[Trajectory, RewardedTrajectory]]] = {}
    for trajectory, rewarded in scored:
        prompt = [_message(m) for m in trajectory.input_messages]
        if prompt and _final_text(trajectory):
            groups.setdefault(canonical(prompt), []).append((trajectory, rewarded))
    pairs: list[Pair] = []
    for key in sorted(groups):
        group = groups[key]
        if len(group) < 2:
            continue
        ranked = sorted(group, key=lambda tr: (-tr[1].reward, tr[0].call_id))
        (best, best_r), (worst, worst_r) = ranked[0], ranked[-1]
        if best_r.reward - worst_r.reward < max(margin, 1e-12):
            continue
        row = _pair_row(json.loads(key), _final_text(best), _final_text(worst))
        if row is not None:
            pairs.append(
                Pair(
                    row,
                    {
                        "source": "ranking",
                        "chosen_call_id": best.call_id,
                        "rejected_call_id": worst.call_id,
                        "chosen_reward": best_r.reward,
                        "rejected_reward": worst_r.reward,
                        "group_size": len(group),
                    },
                )
            )
    return pairs


def dedupe(rows: Sequence[Row], traces: Sequence[Row]) -> tuple[list[Row], list[Row], int]:
    """Drop exact duplicate rows (the first is kept, with its trace); returns the rows, their
    traces and how many were removed."""
    seen: set[str] = set()
    kept: list[Row] = []
    kept_traces: list[Row] = []
    for row, trace in zip(rows, traces, strict=True):
        line = canonical(row)
        if line in seen:
            continue
        seen.add(line)
        kept.append(row)
        kept_traces.append(trace)
    return kept, kept_traces, len(rows) - len(kept)
