"""Unit tests of streams.export.dataset: SFT and DPO rows in OpenAI's formats, dedupe, writing.

Rows are checked twice: with the module's own pydantic models, and with an independent check
written from OpenAI's fine-tuning format documentation (:func:`openai_chat_errors`,
:func:`openai_preference_errors`), so the models cannot drift from the format unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from streams.core.rewards import Rewarder, success
from streams.errors import ConfigError
from streams.export.dataset import (
    DpoRow,
    ExportError,
    ExportFile,
    SftRow,
    check_writable,
    dedupe,
    preference_pairs,
    ranking_pairs,
    sft_messages,
    sft_row,
    trajectory_row,
    write_export,
)
from streams.models import CallStatus, ChatMessage, FeedbackKind, StepKind, Trajectory
from tests.unit.factories import feedback, rewarded, step, trajectory

# -- independent checks of OpenAI's formats ----------------------------------------------------

_ROLES = {"system", "developer", "user", "assistant", "tool"}
_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "weight", "function_call"}


def openai_chat_errors(row: Any) -> list[str]:
    """What OpenAI's chat fine-tuning would refuse in one row (as its docs describe it)."""
    errors = []
    if not isinstance(row, dict) or set(row) - {"messages", "tools", "parallel_tool_calls"}:
        return ["row is not {messages: [...]}"]
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["no messages"]
    open_ids: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            errors.append(f"message {i} has no role")
            continue
        if set(m) - _KEYS:
            errors.append(f"message {i} has unknown keys {set(m) - _KEYS}")
        if m["role"] not in _ROLES:
            errors.append(f"message {i} has role {m['role']}")
        content = m.get("content")
        if m["role"] == "assistant":
            if not content and not m.get("tool_calls"):
                errors.append(f"assistant message {i} is empty")
            for call in m.get("tool_calls") or []:
                if call.get("type") != "function" or not call.get("id"):
                    errors.append(f"bad tool call in message {i}")
                fn = call.get("function", {})
                if not fn.get("name") or not isinstance(fn.get("arguments"), str):
                    errors.append(f"tool call in message {i} needs name and string arguments")
                json.loads(fn.get("arguments", "{}"))
                open_ids.add(call.get("id"))
        elif not isinstance(content, str):
            errors.append(f"{m['role']} message {i} has no text content")
        if m["role"] == "tool" and m.get("tool_call_id") not in open_ids:
            errors.append(f"tool message {i} answers no tool call")
        if "weight" in m and (m["role"] != "assistant" or m["weight"] not in (0, 1)):
            errors.append(f"weight on message {i}")
    if not any(m.get("role") == "assistant" and m.get("weight", 1) == 1 for m in messages):
        errors.append("no assistant message to train on")
    return errors


def openai_preference_errors(row: Any) -> list[str]:
    """What OpenAI's preference (DPO) fine-tuning would refuse in one row."""
    if not isinstance(row, dict) or set(row) != {
        "input",
        "preferred_output",
        "non_preferred_output",
    }:
        return ["row is not {input, preferred_output, non_preferred_output}"]
    errors = []
    messages = row["input"].get("messages")
    if not messages:
        errors.append("input has no messages")
    elif messages[-1]["role"] == "assistant":
        errors.append("input ends with the assistant")
    for side in ("preferred_output", "non_preferred_output"):
        out = row[side]
        if not (
            isinstance(out, list)
            and len(out) == 1
            and out[0].get("role") == "assistant"
            and isinstance(out[0].get("content"), str)
            and out[0]["content"]
        ):
            errors.append(f"{side} is not one assistant message with content")
    return errors


# -- SFT -------------------------------------------------------------------------------------


def llm(seq: int, text: str, tools: list[str] | None = None, **kw: Any) -> Any:
    return step(
        seq=seq,
        output_messages=[ChatMessage(role="assistant", content=text)],
        tool_calls=tools or [],
        **kw,
    )


def tool(seq: int, name: str, output: str) -> Any:
    return step(
        seq=seq,
        kind=StepKind.TOOL,
        tool_name=name,
        output_messages=[ChatMessage(role="tool", content=output, name=name)],
    )


def agent_run(**kw: Any) -> Trajectory:
    fields: dict[str, Any] = {
        "input_messages": [
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Weather in Paris?"),
        ],
        "steps": [
            llm(0, "Let me look.", ["weather"]),
            tool(1, "weather", "18C, sunny"),
            llm(2, "18C and sunny."),
        ],
        "output": "18C and sunny.",
    }
    fields.update(kw)
    return trajectory(**fields)


def test_an_agent_run_becomes_a_valid_conversation() -> None:
    row = sft_row(agent_run())
    assert row is not None
    assert openai_chat_errors(row) == []
    assert [m["role"] for m in row["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    call = row["messages"][2]["tool_calls"][0]
    assert call == {
        "id": "call_0_0",
        "type": "function",
        "function": {"name": "weather", "arguments": "{}"},
    }
    assert row["messages"][3] == {
        "role": "tool",
        "tool_call_id": "call_0_0",
        "content": "18C, sunny",
    }
    assert row["messages"][-1] == {"role": "assistant", "content": "18C and sunny."}


def test_the_final_output_is_added_when_the_last_step_did_not_say_it() -> None:
    messages = sft_messages(agent_run(output="It is 18C and sunny in Paris."))
    assert messages[-2]["content"] == "18C and sunny."
    assert messages[-1] == {"role": "assistant", "content": "It is 18C and sunny in Paris."}


def test_recorded_tool_calls_with_arguments_keep_them() -> None:
    recorded = json.dumps({"name": "weather", "arguments": {"city": "Paris"}})
    row = sft_row(agent_run(steps=[llm(0, "", [recorded]), tool(1, "weather", "18C")]))
    assert row is not None and openai_chat_errors(row) == []
    assert row["messages"][2]["content"] is None
    assert row["messages"][2]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city": "Paris"}',
    }


def test_a_tool_step_no_llm_step_asked_for_gets_a_call() -> None:
    row = sft_row(agent_run(steps=[tool(0, "lookup", "found"), llm(1, "Done.")], output=None))
    assert row is not None and openai_chat_errors(row) == []
    assert row["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0_0",
                "type": "function",
                "function": {"name": "lookup", "arguments": "{}"},
            }
        ],
    }


def test_earlier_turns_are_context_with_weight_zero() -> None:
    history = [
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", content="Hello!"),
        ChatMessage(role="tool", content="orphan", name="x"),
        ChatMessage(role="user", content="Weather?"),
    ]
    row = sft_row(agent_run(input_messages=history))
    assert row is not None and openai_chat_errors(row) == []
    assert row["messages"][1] == {"role": "assistant", "content": "Hello!", "weight": 0}
    assert all(m["role"] != "tool" or "tool_call_id" in m for m in row["messages"])


@pytest.mark.parametrize(
    "traj",
    [
        agent_run(steps=[], output=None),  # nothing the assistant said
        agent_run(steps=[llm(0, "")], output=""),
        agent_run(input_messages=[], steps=[], output="Hi"),  # starts with the assistant
    ],
    ids=["no-output", "empty-output", "no-prompt"],
)
def test_nothing_to_train_on_gives_no_row(traj: Trajectory) -> None:
    assert sft_row(traj) is None


@pytest.mark.parametrize(
    "row",
    [
        {"messages": [{"role": "user", "content": "q"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "a"}]},
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "tool", "tool_call_id": "x", "content": "r"},
                {"role": "assistant", "content": "a"},
            ]
        },
        {
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "extra": 1,
        },
        {
            "messages": [
                {"role": "user", "content": "q", "weight": 1},
                {"role": "assistant", "content": "a"},
            ]
        },
    ],
    ids=[
        "no-assistant",
        "empty-assistant",
        "bad-role",
        "unanswered-tool",
        "extra-key",
        "weight-on-user",
    ],
)
def test_the_sft_model_refuses_what_openai_refuses(row: dict[str, Any]) -> None:
    assert openai_chat_errors(row)
    with pytest.raises(ValueError):
        SftRow.model_validate(row)


# -- DPO -------------------------------------------------------------------------------------


def two_answers(**kw: Any) -> Trajectory:
    prompt = [ChatMessage(role="user", content="Capital of France?")]
    return agent_run(
        steps=[
            llm(0, "Lyon.", input_messages=prompt, response_id="r-0"),
            llm(1, "Paris.", input_messages=prompt, response_id="r-1"),
        ],
        output="Paris.",
        **kw,
    )


def pref(**kw: Any) -> Any:
    return feedback(kind=FeedbackKind.PREFERENCE, rating=None, **kw)


def test_preference_feedback_pairs_the_preferred_response_with_the_named_other() -> None:
    [pair] = preference_pairs(two_answers(), [pref(preferred_response_id="r-1", response_id="r-0")])
    assert openai_preference_errors(pair.row) == []
    DpoRow.model_validate(pair.row)
    assert pair.row == {
        "input": {"messages": [{"role": "user", "content": "Capital of France?"}]},
        "preferred_output": [{"role": "assistant", "content": "Paris."}],
        "non_preferred_output": [{"role": "assistant", "content": "Lyon."}],
    }
    assert pair.trace["source"] == "preference"
    assert pair.trace["rejected_response_id"] == "r-0"


def test_preference_without_the_other_pairs_responses_to_the_same_prompt() -> None:
    [pair] = preference_pairs(two_answers(), [pref(preferred_response_id="r-0")])
    assert pair.row["preferred_output"][0]["content"] == "Lyon."
    assert pair.row["non_preferred_output"][0]["content"] == "Paris."


def test_preference_without_recorded_prompts_uses_the_conversation_so_far() -> None:
    traj = agent_run(
        steps=[llm(0, "Lyon.", response_id="r-0"), llm(1, "Paris.", response_id="r-1")]
    )
    [pair] = preference_pairs(traj, [pref(preferred_response_id="r-1", response_id="r-0")])
    assert openai_preference_errors(pair.row) == []
    assert [m["role"] for m in pair.row["input"]["messages"]] == ["system", "user"]


@pytest.mark.parametrize(
    "fb",
    [
        pref(preferred_response_id="unknown"),
        feedback(rating=5.0),
        pref(preferred_response_id="r-1", response_id="r-1"),
    ],
    ids=["unknown-response", "not-a-preference", "prefers-itself"],
)
def test_no_pair_without_two_distinct_responses(fb: Any) -> None:
    traj = agent_run(steps=[llm(0, "a", response_id="r-0"), llm(1, "b", response_id="r-1")])
    assert preference_pairs(traj, [fb]) == []


def scored(call_id: str, output: str, reward: float, prompt: str = "Capital of France?") -> Any:
    traj = trajectory(
        call_id, input_messages=[ChatMessage(role="user", content=prompt)], output=output
    )
    return traj, rewarded(call_id, reward)


def test_ranking_pairs_best_and_worst_of_a_shared_prompt() -> None:
    items = [
        scored("a", "Paris.", 0.9),
        scored("b", "Lyon.", 0.1),
        scored("c", "Nice.", 0.5),
        scored("d", "Berlin.", 1.0, prompt="Capital of Germany?"),
    ]
    [pair] = ranking_pairs(items, margin=0.5)
    assert openai_preference_errors(pair.row) == []
    assert pair.row["preferred_output"][0]["content"] == "Paris."
    assert pair.row["non_preferred_output"][0]["content"] == "Lyon."
    assert pair.trace == {
        "source": "ranking",
        "chosen_call_id": "a",
        "rejected_call_id": "b",
        "chosen_reward": 0.9,
        "rejected_reward": 0.1,
        "group_size": 3,
    }
    assert ranking_pairs(list(reversed(items)), margin=0.5) == [pair]  # order does not matter


@pytest.mark.parametrize(
    ("items", "margin"),
    [
        ([scored("a", "Paris.", 0.6), scored("b", "Lyon.", 0.5)], 0.2),  # too close
        ([scored("a", "Paris.", 1.0), scored("b", "Paris.", 0.0)], 0.2),  # same output
        ([scored("a", "Paris.", 1.0), scored("b", "Lyon.", 1.0)], 0.0),  # no difference at all
        ([scored("a", "Paris.", 1.0)], 0.0),  # alone
    ],
    ids=["within-margin", "same-output", "tie", "alone"],
)
def test_ranking_makes_no_pair_without_a_clear_preference(items: list[Any], margin: float) -> None:
    assert ranking_pairs(items, margin) == []


def test_the_dpo_model_refuses_what_openai_refuses() -> None:
    same = {
        "input": {"messages": [{"role": "user", "content": "q"}]},
        "preferred_output": [{"role": "assistant", "content": "a"}],
        "non_preferred_output": [{"role": "assistant", "content": "a"}],
    }
    with pytest.raises(ValueError):
        DpoRow.model_validate(same)
    ends_with_answer = {
        **same,
        "input": {
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]
        },
        "non_preferred_output": [{"role": "assistant", "content": "b"}],
    }
    assert openai_preference_errors(ends_with_answer)
    with pytest.raises(ValueError):
        DpoRow.model_validate(ends_with_answer)


# -- dedupe, trajectories, writing -----------------------------------------------------------


def test_dedupe_keeps_the_first_of_exact_duplicates_with_its_trace() -> None:
    rows = [{"a": 1, "b": 2}, {"b": 2, "a": 1}, {"a": 1, "b": 3}, {"a": 1, "b": 2}]
    kept, traces, removed = dedupe(rows, [{"i": i} for i in range(4)])
    assert kept == [{"a": 1, "b": 2}, {"a": 1, "b": 3}]
    assert traces == [{"i": 0}, {"i": 2}]
    assert removed == 2


def test_a_trajectory_row_round_trips_to_the_records() -> None:
    traj = agent_run(status=CallStatus.OK)
    reward = Rewarder(success)(traj)
    row = json.loads(json.dumps(trajectory_row(traj, reward)))
    assert Trajectory.model_validate(row["trajectory"]) == traj
    assert row["reward"]["reward"] == 1.0


def files() -> list[ExportFile]:
    return [
        ExportFile(
            "sft.jsonl",
            "openai-chat-fine-tuning",
            [{"messages": [{"role": "user", "content": "é"}]}],
            [{"call_id": "c"}],
            1,
        ),
        ExportFile("dpo.jsonl", "openai-preference-fine-tuning", [], []),
    ]


def test_write_export_writes_every_file_and_a_manifest_that_traces_them(tmp_path: Path) -> None:
    manifest = write_export(tmp_path, files(), {"replay_id": "r1"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dpo.jsonl", "manifest.json", "sft.jsonl"]
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == manifest
    sft = on_disk["files"]["sft.jsonl"]
    data = (tmp_path / "sft.jsonl").read_bytes()
    assert data.decode() == '{"messages":[{"content":"é","role":"user"}]}\n'
    assert sft == {
        "format": "openai-chat-fine-tuning",
        "rows": 1,
        "duplicates_removed": 1,
        "sha256": hashlib.sha256(data).hexdigest(),
        "trace": [{"call_id": "c"}],
    }
    assert (tmp_path / "dpo.jsonl").read_text() == ""


def test_write_export_replaces_an_earlier_export(tmp_path: Path) -> None:
    (tmp_path / "sft.jsonl").write_text("old\n")
    write_export(tmp_path, files(), {})
    assert "old" not in (tmp_path / "sft.jsonl").read_text()


def test_a_failed_write_leaves_nothing_half_written(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "sft.jsonl").write_text("previous export\n")
    real_replace = os.replace
    calls = []

    def failing_replace(src: Any, dst: Any) -> None:
        calls.append(dst)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(ExportError, match="No space left on device"):
        write_export(tmp_path, files(), {})
    monkeypatch.setattr(os, "replace", real_replace)
    assert calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft.jsonl"]  # no temporary files
    assert (tmp_path / "sft.jsonl").read_text() == "previous export\n"


def test_check_writable_creates_the_directory(tmp_path: Path) -> None:
    out = check_writable(tmp_path / "a" / "b")
    assert out.is_dir() and list(out.iterdir()) == []


def test_check_writable_refuses_a_path_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot write the export to"):
        check_writable(tmp_path / "file" / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_exported_files_are_ordinary_files(tmp_path: Path) -> None:
    write_export(tmp_path, files(), {})
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "sft.jsonl").stat().st_mode & 0o777 == 0o666 & ~mask
