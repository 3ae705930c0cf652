"""Unit tests of streams.capture.apis.responses: the Responses API's requests and answers as
records, translated to chat completions for Trinity and back; every input and output item type;
request bodies made by the official ``openai`` client and the OpenAI Agents SDK; answers parsed
by them."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from streams.capture.apis import (
    ApiRequestError,
    answer_of_chat,
    answer_of_response,
    chat_to_response,
    llm_step,
    output_items,
    tool_steps,
)
from streams.capture.apis.responses import parse_request, previous_not_found
from streams.models import ChatMessage, StepKind, ToolCall
from tests.unit.factories import T0

from .server import chat_completion, serve

FN_TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look an order up.",
    "parameters": {"type": "object", "properties": {"order": {"type": "integer"}}},
    "strict": True,
}


def req(*items: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-5", "input": list(items), **extra}


def m(role: str, content: str = "", **kw: Any) -> ChatMessage:
    return ChatMessage(role=role, content=content, **kw)


# -- input items ------------------------------------------------------------------------------

ITEMS: list[tuple[str, list[Any], list[ChatMessage], list[dict[str, Any]] | None]] = [
    ("string input", ["hi"], [m("user", "hi")], [{"role": "user", "content": "hi"}]),
    (
        "easy message, text parts",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_text", "text": "b"},
                ],
            }
        ],
        [m("user", "ab")],
        [{"role": "user", "content": "ab"}],
    ),
    (
        "typed message, developer",
        [{"type": "message", "role": "developer", "content": "rules"}],
        [m("developer", "rules")],
        [{"role": "system", "content": "rules"}],
    ),
    (
        "image by url",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "see"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,AA",
                        "detail": "low",
                    },
                ],
            }
        ],
        [m("user", "see")],
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,AA", "detail": "low"},
                    },
                ],
            }
        ],
    ),
    (
        "file by data",
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_file",
                        "file_data": "data:application/pdf;base64,AA",
                        "filename": "a.pdf",
                    }
                ],
            }
        ],
        [m("user", "")],
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "file",
                        "file": {
                            "file_data": "data:application/pdf;base64,AA",
                            "filename": "a.pdf",
                        },
                    }
                ],
            }
        ],
    ),
    (
        "assistant output message (history)",
        [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
            }
        ],
        [m("assistant", "Hello")],
        [{"role": "assistant", "content": "Hello"}],
    ),
    (
        "reasoning, function calls, their outputs",
        [
            {"role": "user", "content": "where are 1 and 2?"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "two lookups"}],
                "encrypted_content": "xyz",
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "lookup",
                "arguments": '{"order": 1}',
            },
            {
                "type": "function_call",
                "id": "fc_2",
                "call_id": "call_2",
                "name": "lookup",
                "arguments": '{"order": 2}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "shipped"},
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "lost"}],
            },
        ],
        [
            m("user", "where are 1 and 2?"),
            m(
                "assistant",
                tool_calls=[
                    ToolCall(id="call_1", name="lookup", arguments='{"order": 1}'),
                    ToolCall(id="call_2", name="lookup", arguments='{"order": 2}'),
                ],
                reasoning="two lookups",
            ),
            m("tool", "shipped", name="lookup", tool_call_id="call_1"),
            m("tool", "lost", name="lookup", tool_call_id="call_2"),
        ],
        [
            {"role": "user", "content": "where are 1 and 2?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "two lookups",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"order": 1}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"order": 2}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
            {"role": "tool", "tool_call_id": "call_2", "content": "lost"},
        ],
    ),
    (
        "reasoning text and a message in one response",
        [
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Answer", "annotations": []}],
            },
            {"role": "user", "content": "thanks"},
        ],
        [m("assistant", "Answer", reasoning="think"), m("user", "thanks")],
        [
            {"role": "assistant", "content": "Answer", "reasoning_content": "think"},
            {"role": "user", "content": "thanks"},
        ],
    ),
    (
        "refusal in history",
        [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "refusal", "refusal": "I can't."}],
            }
        ],
        [m("assistant", "I can't.")],
        [{"role": "assistant", "content": "I can't."}],
    ),
]


@pytest.mark.parametrize(("name", "items", "records", "chat"), ITEMS, ids=[i[0] for i in ITEMS])
def test_input_items_become_record_messages_and_chat_messages(
    name: str, items: list[Any], records: list[ChatMessage], chat: list[dict[str, Any]] | None
) -> None:
    body = {"model": "gpt-5", "input": items[0] if isinstance(items[0], str) else items}
    parsed = parse_request(body)
    assert parsed.messages == records
    assert parsed.unsupported is None and parsed.chat is not None
    assert parsed.chat["messages"] == chat


UNSUPPORTED = [
    (
        "web_search_call",
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "q"},
        },
        "assistant",
    ),
    (
        "computer_call_output",
        {
            "type": "computer_call_output",
            "call_id": "c1",
            "output": {"type": "computer_screenshot", "image_url": "x"},
        },
        "tool",
    ),
    ("item_reference", {"type": "item_reference", "id": "msg_9"}, "item_reference"),
    (
        "mcp_list_tools",
        {"type": "mcp_list_tools", "id": "m1", "server_label": "s", "tools": []},
        "mcp_list_tools",
    ),
    (
        "custom_tool_call",
        {"type": "custom_tool_call", "call_id": "c2", "name": "grep", "input": "x"},
        "assistant",
    ),
]


@pytest.mark.parametrize(("kind", "item", "role"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_items_chat_cannot_express_are_kept_as_data_and_named(
    kind: str, item: dict[str, Any], role: str
) -> None:
    parsed = parse_request(req({"role": "user", "content": "go"}, item))
    assert parsed.chat is None and parsed.unsupported == f"input item of type {kind}"
    last = parsed.messages[-1]
    assert last.role == role
    if role == "assistant":
        (call,) = last.tool_calls
        assert call.name in (kind, item.get("name"))
    elif role == "tool":
        assert last.tool_call_id == item["call_id"]
    else:
        assert json.loads(last.content) == item


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"tools": [{"type": "web_search"}]}, "tool of type web_search"),
        (
            {"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
            "tool_choice of type allowed_tools",
        ),
        ({"prompt": {"id": "pmpt_1"}}, "prompt (server-side state)"),
        ({"conversation": "conv_1"}, "conversation (server-side state)"),
        ({"background": True}, "background"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "file_id": "f1", "detail": "auto"}],
                    }
                ]
            },
            "input_image by file_id",
        ),
    ],
)
def test_requests_chat_cannot_express_have_no_chat_body(extra: dict[str, Any], says: str) -> None:
    parsed = parse_request({"model": "gpt-5", "input": "hi", **extra})
    assert parsed.chat is None and says in (parsed.unsupported or "")
    assert parsed.messages[-1] == m("user", "hi") or extra.get("input")


def test_request_settings_are_translated() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "Be brief.",
        "input": "where is 42?",
        "tools": [FN_TOOL],
        "tool_choice": {"type": "function", "name": "lookup"},
        "parallel_tool_calls": False,
        "temperature": 0.2,
        "top_p": 0.9,
        "max_output_tokens": 300,
        "text": {
            "format": {
                "type": "json_schema",
                "name": "answer",
                "schema": {"type": "object"},
                "strict": True,
            }
        },
        "reasoning": {"effort": "low", "summary": "auto"},
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "metadata": {"k": "v"},
        "user": "u-1",
    }
    parsed = parse_request(body)
    assert parsed.messages == [m("system", "Be brief."), m("user", "where is 42?")]
    assert parsed.stream and parsed.model == "gpt-5"
    assert parsed.chat == {
        "model": "gpt-5",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "where is 42?"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 300,
        "parallel_tool_calls": False,
        "user": "u-1",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "parameters": FN_TOOL["parameters"],
                    "description": "Look an order up.",
                    "strict": True,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
        },
        "reasoning_effort": "low",
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"input": "hi"}, "model"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": ["hi"]}, "input[0]"),
        ({"model": "m", "input": [{"content": "no role"}]}, "input[0].role"),
        ({"model": "m", "input": "hi", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "hi", "instructions": 1}, "instructions"),
    ],
)
def test_malformed_requests_name_what_is_wrong(body: Any, param: str | None) -> None:
    with pytest.raises(ApiRequestError) as caught:
        parse_request(body)
    assert caught.value.param == param and str(caught.value)


def test_history_comes_first_and_the_answer_seq_counts_the_whole_conversation() -> None:
    first = parse_request(req({"role": "user", "content": "where is 42?"}, tools=[FN_TOOL]))
    output = [
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"order": 42}',
        }
    ]
    history = first.items + output
    second = parse_request(
        req(
            {"type": "function_call_output", "call_id": "call_1", "output": "shipped"},
            previous_response_id="resp_1",
        ),
        history,
    )
    assert [x.role for x in second.messages] == ["user", "assistant", "tool"]
    (step,) = tool_steps("c1", second.messages, T0)
    assert (step.seq, step.kind, step.tool_name, step.tool_call_id) == (
        2,
        StepKind.TOOL,
        "lookup",
        "call_1",
    )
    answer = answer_of_chat(chat_completion("It shipped."))
    llm = llm_step("c1", second, answer, upstream="trinity", latency_ms=12.5, now=T0)
    assert llm.seq == 3 and llm.event_id == "c1/3" and llm.response_id == "chatcmpl-1"
    assert llm.input_messages == second.messages and llm.output_messages[0].content == "It shipped."
    assert (llm.input_tokens, llm.output_tokens, llm.upstream) == (11, 7, "trinity")


def test_previous_not_found_is_openais_error() -> None:
    body = previous_not_found("resp_x")
    assert body["error"]["code"] == "previous_response_not_found"
    assert body["error"]["param"] == "previous_response_id"


# -- answers ----------------------------------------------------------------------------------

RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "gpt-5-2025",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}]},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"order": 42}',
            "status": "completed",
        },
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "q"},
        },
    ],
    "usage": {"input_tokens": 20, "output_tokens": 9, "total_tokens": 29},
}


def test_an_answer_is_one_assistant_message_with_tool_calls_and_reasoning() -> None:
    answer = answer_of_response(RESPONSE)
    assert answer.message == m(
        "assistant",
        "Checking.",
        tool_calls=[
            ToolCall(id="call_1", name="lookup", arguments='{"order": 42}'),
            ToolCall(
                id="ws_1",
                name="web_search_call",
                arguments='{"action": {"query": "q", "type": "search"}}',
            ),
        ],
        reasoning="plan",
    )
    assert (answer.response_id, answer.model, answer.finish_reasons) == (
        "resp_1",
        "gpt-5-2025",
        ["tool_calls"],
    )
    assert (answer.input_tokens, answer.output_tokens) == (20, 9)
    assert output_items(RESPONSE) == RESPONSE["output"]


@pytest.mark.parametrize(
    ("status", "details", "reason"),
    [
        ("completed", None, "stop"),
        ("incomplete", {"reason": "max_output_tokens"}, "length"),
        ("incomplete", {"reason": "content_filter"}, "content_filter"),
        ("failed", None, "failed"),
    ],
)
def test_finish_reasons_are_in_the_chat_vocabulary(status: str, details: Any, reason: str) -> None:
    response = {"id": "r", "status": status, "incomplete_details": details, "output": []}
    assert answer_of_response(response).finish_reasons == [reason]


# -- Trinity's answer, back in the client's API ------------------------------------------------


@pytest.mark.parametrize(
    "completion",
    [
        chat_completion("It shipped."),
        chat_completion(
            None,
            tool_calls=[
                ("call_1", "lookup", '{"order": 42}'),
                ("call_2", "lookup", '{"order": 7}'),
            ],
        ),
        chat_completion(
            "Let me look.", tool_calls=[("call_1", "lookup", "{}")], reasoning="a lookup"
        ),
        chat_completion("Cut", finish="length"),
    ],
    ids=["text", "parallel-tools", "reasoning-text-tool", "length"],
)
async def test_trinitys_answer_is_a_response_the_official_client_reads(
    completion: dict[str, Any],
) -> None:
    parsed = parse_request(req({"role": "user", "content": "where is 42?"}, tools=[FN_TOOL]))
    translated = chat_to_response(completion, parsed)
    Response.model_validate(translated)  # the client's own type, strictly
    async with (
        serve(translated) as server,
        openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        got = await client.responses.create(**parsed.body)
    assert got.id == "resp_chatcmpl-1"
    message = completion["choices"][0]["message"]
    assert got.output_text == (message["content"] or "")
    calls = [(o.call_id, o.name, o.arguments) for o in got.output if o.type == "function_call"]
    assert calls == [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls", [])
    ]
    assert got.usage is not None and (got.usage.input_tokens, got.usage.output_tokens) == (11, 7)
    if completion["choices"][0]["finish_reason"] == "length":
        assert got.status == "incomplete" and got.incomplete_details is not None
    # what the client sends back next (its output as input) translates to the same messages
    again = parse_request(req(*[o.model_dump(exclude_none=True) for o in got.output]))
    record = answer_of_chat(completion).message
    assert again.messages == [record]
    assert answer_of_response(translated).message == record


# -- what the official clients send ------------------------------------------------------------


async def test_the_openai_clients_request_with_tools_and_tool_results() -> None:
    answer = chat_to_response(chat_completion("It shipped."), parse_request(req()))
    async with (
        serve(answer) as server,
        openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        await client.responses.create(
            model="gpt-5",
            instructions="Be brief.",
            input=[
                {"role": "user", "content": "where is 42?"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "lookup",
                    "arguments": '{"order": 42}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "shipped"},
            ],
            tools=[FN_TOOL],  # type: ignore[list-item]
            max_output_tokens=100,
        )
    (sent,) = server.requests
    assert sent.path == "/v1/responses"
    parsed = parse_request(sent.body)
    assert parsed.messages == [
        m("system", "Be brief."),
        m("user", "where is 42?"),
        m(
            "assistant",
            tool_calls=[ToolCall(id="call_1", name="lookup", arguments='{"order": 42}')],
        ),
        m("tool", "shipped", name="lookup", tool_call_id="call_1"),
    ]
    assert parsed.chat is not None and parsed.chat["tools"][0]["function"]["name"] == "lookup"
    assert parsed.chat["max_tokens"] == 100


async def test_an_agents_sdk_run_with_a_function_tool_through_the_translation() -> None:
    """A real Agent with a function_tool, Runner.run: the model answers come from chat
    completions translated by chat_to_response; every request the SDK sends is parsed."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def lookup(order: int) -> str:
        """Look an order up."""
        return f"order {order} shipped"

    answers = [
        chat_completion(
            None, tool_calls=[("call_1", "lookup", '{"order": 42}')], chat_id="chatcmpl-a"
        ),
        chat_completion("Order 42 shipped.", chat_id="chatcmpl-b"),
    ]

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        parsed = parse_request(body)
        assert parsed.chat is not None, parsed.unsupported
        return chat_to_response(answers.pop(0), parsed)

    async with (
        serve(answer, answer) as server,
        openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        agent = Agent(
            name="support",
            instructions="Answer order questions.",
            tools=[lookup],
            model=OpenAIResponsesModel(model="gpt-5", openai_client=client),
        )
        result = await Runner.run(agent, "Where is order 42?")
    assert result.final_output == "Order 42 shipped."
    first, second = (parse_request(r.body) for r in server.requests)
    assert [x.role for x in first.messages] == ["system", "user"]
    assert second.messages[:2] == first.messages
    assert second.messages[2].tool_calls == [
        ToolCall(id="call_1", name="lookup", arguments='{"order": 42}')
    ]
    assert second.messages[3] == m("tool", "order 42 shipped", name="lookup", tool_call_id="call_1")
    (step,) = tool_steps("c", second.messages, T0)
    assert step.seq == 3 and step.tool_name == "lookup"
