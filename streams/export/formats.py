"""The formats of the export files: OpenAI's chat (SFT) and preference (DPO) fine-tuning rows
as strict models (:class:`SftRow`, :class:`DpoRow`), a row, a pair of rows with its trace, and a
row's canonical text (what duplicates are told by).

May import: pydantic, the top-level modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AssistantOutput",
    "DpoInput",
    "DpoRow",
    "Message",
    "Pair",
    "Row",
    "SftRow",
    "ToolCall",
    "ToolFunction",
    "canonical",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToolFunction(_Strict):
    name: str = Field(min_length=1)
    arguments: str


class ToolCall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: ToolFunction


class Message(_Strict):
    """One message of OpenAI's chat format, as fine-tuning accepts it."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    weight: Literal[0, 1] | None = None

    @model_validator(mode="after")
    def _shape(self) -> Message:
        if self.role == "assistant":
            if not self.content and not self.tool_calls:
                raise ValueError("an assistant message needs content or tool_calls")
        else:
            if self.content is None:
                raise ValueError(f"a {self.role} message needs content")
            if self.tool_calls is not None or self.weight is not None:
                raise ValueError(f"a {self.role} message cannot have tool_calls or weight")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("tool_call_id is required on tool messages, and only there")
        return self


class SftRow(_Strict):
    """A row of OpenAI's chat fine-tuning format (``{"messages": [...]}``)."""

    messages: list[Message] = Field(min_length=2)

    @model_validator(mode="after")
    def _conversation(self) -> SftRow:
        if not any(m.role == "assistant" and m.weight != 0 for m in self.messages):
            raise ValueError("no assistant message to train on")
        if self.messages[0].role == "assistant":
            raise ValueError("the conversation starts with the assistant")
        called: set[str] = set()
        for m in self.messages:
            for call in m.tool_calls or []:
                called.add(call.id)
            if m.role == "tool" and m.tool_call_id not in called:
                raise ValueError(f"tool message answers unknown tool_call_id {m.tool_call_id!r}")
        return self


class AssistantOutput(_Strict):
    role: Literal["assistant"]
    content: str = Field(min_length=1)


class DpoInput(_Strict):
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None


class DpoRow(_Strict):
    """A row of OpenAI's preference (DPO) fine-tuning format."""

    input: DpoInput
    preferred_output: list[AssistantOutput] = Field(min_length=1, max_length=1)
    non_preferred_output: list[AssistantOutput] = Field(min_length=1, max_length=1)

    @model_validator(mode="after")
    def _different(self) -> DpoRow:
        if self.preferred_output[0].content == self.non_preferred_output[0].content:
            raise ValueError("preferred and non-preferred outputs are the same")
        if self.input.messages[-1].role == "assistant":
            raise ValueError("the input ends with an assistant message")
        return self


Row = dict[str, Any]


@dataclass(frozen=True)
class Pair:
    """A DPO row and where it came from (for the manifest's trace)."""

    row: Row
    trace: Row


def canonical(row: Any) -> str:
    """The row as one line of JSON, keys sorted: equal rows give equal lines."""
    return json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
