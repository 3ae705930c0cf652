"""SFT rows write the real tool calls the gateway recorded (ids, names, JSON arguments)."""

from __future__ import annotations

from streams.export import sft_messages
from streams.models import ChatMessage, StepKind, ToolCall
from tests.unit.factories import step, trajectory


def test_structured_tool_calls_are_written_with_their_ids_and_arguments() -> None:
    calls = [
        ToolCall(id="call_abc", name="lookup", arguments='{"order": 42}'),
        ToolCall(id="call_def", name="lookup", arguments='{"order": 7}'),
    ]
    traj = trajectory(
        input_messages=[ChatMessage(role="user", content="orders 42 and 7?")],
        output=None,
        steps=[
            step(
                seq=1,
                output_messages=[ChatMessage(role="assistant", content="")],
                tool_calls=["lookup", "lookup"],
                tool_call_details=calls,
            ),
            # answered out of order: the tool_call_id decides, not the name
            step(
                seq=2,
                kind=StepKind.TOOL,
                tool_name="lookup",
                tool_call_id="call_def",
                output_messages=[ChatMessage(role="tool", content="7: shipped")],
            ),
            step(
                seq=3,
                kind=StepKind.TOOL,
                tool_name="lookup",
                tool_call_id="call_abc",
                output_messages=[ChatMessage(role="tool", content="42: packed")],
            ),
            step(
                seq=4, output_messages=[ChatMessage(role="assistant", content="Both on the way.")]
            ),
        ],
    )
    messages = sft_messages(traj)
    assert messages[1]["tool_calls"] == [
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"order": 42}'},
        },
        {
            "id": "call_def",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"order": 7}'},
        },
    ]
    assert messages[2] == {"role": "tool", "tool_call_id": "call_def", "content": "7: shipped"}
    assert messages[3] == {"role": "tool", "tool_call_id": "call_abc", "content": "42: packed"}
    assert messages[4] == {"role": "assistant", "content": "Both on the way."}
