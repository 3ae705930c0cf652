"""Unit tests of streams.capture.apis.messages and messages_stream: Anthropic's Messages API
as records and as chat completions both ways; every content block type; what the official
``anthropic`` client sends (streamed and not, with tools); Trinity's answers as the client reads
them, whole and streamed (checked by the client's own types and stream accumulator)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message

from streams.capture.apis import (
    ApiRequestError,
    ChatToMessagesStream,
    MessagesStreamAssembler,
    answer_of_chat,
    answer_of_message,
    chat_to_message,
    llm_step,
    tool_steps,
)
from streams.capture.apis.common import json_object
from streams.capture.apis.messages import error_body, parse_request
from streams.capture.apis.sse import encode_event
from streams.models import ChatMessage, ToolCall
from tests.unit.factories import T0

from .server import chat_completion, chat_stream, serve

TOOL = {
    "name": "lookup",
    "description": "Look an order up.",
    "input_schema": {"type": "object", "properties": {"order": {"type": "integer"}}},
}


def m(role: str, content: str = "", **kw: Any) -> ChatMessage:
    return ChatMessage(role=role, content=content, **kw)


def body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 100, "messages": list(messages), **extra}


# -- content blocks ---------------------------------------------------------------------------

BLOCKS: list[tuple[str, list[dict[str, Any]], list[ChatMessage], list[dict[str, Any]]]] = [
    (
        "string content",
        [{"role": "user", "content": "hi"}],
        [m("user", "hi")],
        [{"role": "user", "content": "hi"}],
    ),
    (
        "text blocks",
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
        [m("user", "a\nb")],
        [{"role": "user", "content": "a\nb"}],
    ),
    (
        "base64 image",
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
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
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                ],
            }
        ],
    ),
    (
        "text document",
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "the doc"},
                    }
                ],
            }
        ],
        [m("user", "the doc")],
        [{"role": "user", "content": "the doc"}],
    ),
    (
        "tool use, thinking and tool results",
        [
            {"role": "user", "content": "where are 1 and 2?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "two lookups", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"order": 1}},
                    {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"order": 2}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "shipped"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "lost"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "and?"},
                ],
            },
        ],
        [
            m("user", "where are 1 and 2?"),
            m(
                "assistant",
                "Checking.",
                tool_calls=[
                    ToolCall(id="toolu_1", name="lookup", arguments='{"order": 1}'),
                    ToolCall(id="toolu_2", name="lookup", arguments='{"order": 2}'),
                ],
                reasoning="two lookups",
            ),
            m("tool", "shipped", name="lookup", tool_call_id="toolu_1"),
            m("tool", "lost", name="lookup", tool_call_id="toolu_2"),
            m("user", "and?"),
        ],
        [
            {"role": "user", "content": "where are 1 and 2?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "two lookups",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"order": 1}'},
                    },
                    {
                        "id": "toolu_2",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"order": 2}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "shipped"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "lost"},
            {"role": "user", "content": "and?"},
        ],
    ),
    (
        "system role message",
        [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}],
        [m("system", "rules"), m("user", "hi")],
        [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}],
    ),
]


@pytest.mark.parametrize(
    ("name", "messages", "records", "chat"), BLOCKS, ids=[b[0] for b in BLOCKS]
)
def test_content_blocks_become_record_messages_and_chat_messages(
    name: str,
    messages: list[dict[str, Any]],
    records: list[ChatMessage],
    chat: list[dict[str, Any]],
) -> None:
    parsed = parse_request(body(*messages))
    assert parsed.messages == records
    assert parsed.unsupported is None and parsed.chat is not None
    assert parsed.chat["messages"] == chat


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tool of type web_search_20250305",
        ),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tool of type bash_20250124"),
        ({"container": "cont_1"}, "container"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "file", "file_id": "f"}}
                        ],
                    }
                ]
            },
            "document of source type file",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "server_tool_use",
                                "id": "srvtoolu_1",
                                "name": "web_search",
                                "input": {"query": "q"},
                            },
                            {
                                "type": "web_search_tool_result",
                                "tool_use_id": "srvtoolu_1",
                                "content": [
                                    {
                                        "type": "web_search_result",
                                        "url": "u",
                                        "title": "t",
                                        "encrypted_content": "e",
                                    }
                                ],
                            },
                        ],
                    }
                ]
            },
            "web_search (a server tool)",
        ),
    ],
)
def test_requests_chat_cannot_express_have_no_chat_body(extra: dict[str, Any], says: str) -> None:
    parsed = parse_request({**body({"role": "user", "content": "hi"}), **extra})
    assert parsed.chat is None and says in (parsed.unsupported or "")
    if "server_tool_use" in json.dumps(extra):  # kept as data: a tool call and its result
        assert parsed.messages[0].tool_calls[0].name == "web_search"
        assert parsed.messages[1].role == "tool" and parsed.messages[1].tool_call_id == "srvtoolu_1"


def test_request_settings_are_translated() -> None:
    parsed = parse_request(
        body(
            {"role": "user", "content": "where is 42?"},
            system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            tools=[TOOL],
            tool_choice={"type": "tool", "name": "lookup", "disable_parallel_tool_use": True},
            temperature=0.3,
            top_p=0.8,
            top_k=20,
            stop_sequences=["END"],
            stream=True,
            metadata={"user_id": "u-1"},
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    )
    assert parsed.messages == [m("system", "Be brief."), m("user", "where is 42?")]
    assert parsed.chat == {
        "model": "claude-x",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "where is 42?"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 100,
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 20,
        "stop": ["END"],
        "user": "u-1",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "parameters": TOOL["input_schema"],
                    "description": "Look an order up.",
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "parallel_tool_calls": False,
    }


@pytest.mark.parametrize(
    ("choice", "chat"),
    [({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none")],
)
def test_tool_choices(choice: dict[str, Any], chat: str) -> None:
    parsed = parse_request(body({"role": "user", "content": "x"}, tools=[TOOL], tool_choice=choice))
    assert parsed.chat is not None and parsed.chat["tool_choice"] == chat


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ("nope", None),
        ({"messages": []}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages.0"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
            "messages.0.content.0",
        ),
        ({"model": "m", "messages": [], "system": 5}, "system"),
        ({"model": "m", "messages": [], "stream": 1}, "stream"),
    ],
)
def test_malformed_requests_name_what_is_wrong(raw: Any, param: str | None) -> None:
    with pytest.raises(ApiRequestError) as caught:
        parse_request(raw)
    assert caught.value.param == param
    assert error_body(str(caught.value))["error"]["type"] == "invalid_request_error"


# -- answers ----------------------------------------------------------------------------------

MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-x-2026",
    "content": [
        {"type": "thinking", "thinking": "look it up", "signature": "sig"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"order": 42}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 10,
        "cache_read_input_tokens": 90,
        "cache_creation_input_tokens": 5,
        "output_tokens": 12,
    },
}


def test_an_answer_is_one_assistant_message_with_tool_calls_and_thinking() -> None:
    answer = answer_of_message(MESSAGE)
    assert answer.message == m(
        "assistant",
        "Checking.",
        tool_calls=[ToolCall(id="toolu_1", name="lookup", arguments='{"order": 42}')],
        reasoning="look it up",
    )
    assert (answer.response_id, answer.model, answer.finish_reasons) == (
        "msg_01",
        "claude-x-2026",
        ["tool_calls"],
    )
    assert (answer.input_tokens, answer.output_tokens) == (105, 12)  # the cache's tokens count


@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ],
)
def test_stop_reasons_are_in_the_chat_vocabulary(stop: str, reason: str) -> None:
    assert answer_of_message({**MESSAGE, "stop_reason": stop}).finish_reasons == [reason]


def test_records_of_an_exchange() -> None:
    parsed = parse_request(
        body(
            {"role": "user", "content": "where is 42?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"order": 42}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "shipped"}
                ],
            },
            system="Be brief.",
        )
    )
    (tool,) = tool_steps("c", parsed.messages, T0)
    assert (tool.seq, tool.tool_name, tool.output_messages[0].content) == (3, "lookup", "shipped")
    step = llm_step(
        "c",
        parsed,
        answer_of_chat(chat_completion("Shipped.")),
        upstream="trinity",
        latency_ms=3,
        now=T0,
    )
    assert step.seq == 4 and step.response_id == "chatcmpl-1" and step.request_model == "claude-x"


@pytest.mark.parametrize(
    "completion",
    [
        chat_completion("It shipped."),
        chat_completion(
            None,
            tool_calls=[("call_1", "lookup", '{"order": 42}'), ("call_2", "lookup", "not json")],
        ),
        chat_completion("Looking.", tool_calls=[("call_1", "lookup", "{}")], reasoning="check"),
        chat_completion("Cut", finish="length"),
    ],
    ids=["text", "tools", "thinking-text-tool", "length"],
)
async def test_trinitys_answer_is_a_message_the_official_client_reads(
    completion: dict[str, Any],
) -> None:
    parsed = parse_request(body({"role": "user", "content": "where is 42?"}, tools=[TOOL]))
    translated = chat_to_message(completion, parsed)
    Message.model_validate(translated)
    async with (
        serve(translated) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="unused") as client,
    ):
        got = await client.messages.create(**parsed.body)
    assert got.id == "msg_chatcmpl-1" and got.usage.input_tokens == 11
    finish = completion["choices"][0]["finish_reason"]
    assert (
        got.stop_reason
        == {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}[finish]
    )
    # what the client sends back as the assistant turn translates to Trinity's message again
    again = parse_request(
        body(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in got.content]}
        )
    )
    record = answer_of_chat(completion).message
    # a tool input is a JSON object: arguments that are not one come back under "input"
    calls = [
        c.model_copy(update={"arguments": json.dumps(json_object(c.arguments))})
        for c in record.tool_calls
    ]
    assert again.messages == [record.model_copy(update={"tool_calls": calls})]


# -- streams ----------------------------------------------------------------------------------

STREAMS = {
    "text": chat_completion("Order 42 shipped yesterday."),
    "thinking-then-text": chat_completion("Shipped.", reasoning="I should check the order."),
    "parallel-tools-interleaved": chat_completion(
        None,
        tool_calls=[("call_1", "lookup", '{"order": 42}'), ("call_2", "lookup", '{"order": 7}')],
    ),
    "text-and-tool": chat_completion(
        "Looking.", tool_calls=[("call_1", "lookup", '{"order": 42}')]
    ),
    "length": chat_completion("Cut sho", finish="length"),
}


@pytest.mark.parametrize("name", list(STREAMS))
async def test_trinitys_stream_reaches_the_official_client_as_messages_events(name: str) -> None:
    completion = STREAMS[name]
    request = body({"role": "user", "content": "where is 42?"}, tools=[TOOL], stream=True)
    parsed = parse_request(request)
    translator = ChatToMessagesStream(parsed)
    chat_bytes = chat_stream(completion, interleave=True)
    out = b""
    for i in range(0, len(chat_bytes), 40):
        out += translator.feed(chat_bytes[i : i + 40])
    out += translator.finish()
    assert answer_of_chat(translator.completion()) == answer_of_chat(completion)
    async with (
        serve(out, out) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="unused") as client,
    ):
        kinds = [e.type async for e in await client.messages.create(**request)]
        async with client.messages.stream(
            **{k: v for k, v in request.items() if k != "stream"}
        ) as stream:
            final = await stream.get_final_message()
    sent = parse_request(server.requests[0].body)
    assert (
        sent.stream
        and sent.chat is not None
        and sent.chat["tools"][0]["function"]["name"] == "lookup"
    )
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert answer_of_message(final.model_dump()).message == answer_of_chat(completion).message
    assert final.usage.output_tokens == 7 and final.usage.input_tokens == 11
    assembler = MessagesStreamAssembler()
    assembler.feed(out)
    assert assembler.done
    assert assembler.message()["content"] == final.model_dump(exclude_none=True)["content"]
    assert answer_of_message(assembler.message()) == answer_of_message(final.model_dump())


def anthropic_events() -> list[dict[str, Any]]:
    """A streamed answer as Anthropic sends it: thinking with its signature, text with a
    citation, a tool use whose input comes in pieces, ping, the stop reason and usage."""
    start = {
        **MESSAGE,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    citation = {
        "type": "char_location",
        "cited_text": "x",
        "document_index": 0,
        "document_title": None,
        "start_char_index": 0,
        "end_char_index": 1,
    }
    return [
        {"type": "message_start", "message": start},
        {"type": "ping"},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "look "},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "it up"},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "sig"},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "text_delta", "text": "Check"},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "citations_delta", "citation": citation},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "text_delta", "text": "ing."},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"ord'},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": 'er": 42}'},
        },
        {"type": "content_block_stop", "index": 2},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 12, "cache_read_input_tokens": 90},
        },
        {"type": "message_stop"},
    ]


def test_a_streamed_message_is_put_back_together_as_the_client_does() -> None:
    events = anthropic_events()
    snapshot = None
    bufs: dict[int, bytes] = {}
    for event in events:
        if event["type"] == "ping":
            continue
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    data = b"".join(encode_event(e) for e in events)
    for size in (1, 13, len(data)):
        assembler = MessagesStreamAssembler()
        for i in range(0, len(data), size):
            assembler.feed(data[i : i + size])
        assert assembler.done
        got = assembler.message()
        assert _no_nones(got["content"]) == snapshot.model_dump(exclude_none=True)["content"]
        assert got["stop_reason"] == "tool_use" and got["usage"]["output_tokens"] == 12
        answer = answer_of_message(got)
        assert answer == answer_of_message({**MESSAGE, "usage": got["usage"]})
        assert answer.input_tokens == 100


def _no_nones(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nones(v) for v in value]
    return value


def test_a_broken_stream_is_not_done_and_a_failed_chat_stream_is_an_error_event() -> None:
    events = anthropic_events()[:10]
    assembler = MessagesStreamAssembler()
    assembler.feed(b"".join(encode_event(e) for e in events))
    assert (
        not assembler.done
        and answer_of_message(assembler.message()).message.reasoning == "look it up"
    )
    translator = ChatToMessagesStream(parse_request(body({"role": "user", "content": "x"})))
    out = translator.feed(chat_stream(chat_completion("half"))[:200]) + translator.fail(
        "upstream broke off"
    )
    broken = MessagesStreamAssembler()
    broken.feed(out)
    assert (
        broken.error == {"type": "api_error", "message": "upstream broke off"} and not broken.done
    )
    assert translator.finish() == b""


async def test_the_anthropic_clients_requests_with_tools_and_tool_results() -> None:
    answer = chat_to_message(chat_completion("Shipped."), parse_request(body()))
    async with (
        serve(answer) as server,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="unused") as client,
    ):
        await client.messages.create(
            model="claude-x",
            max_tokens=200,
            system="Be brief.",
            tools=[TOOL],  # type: ignore[list-item]
            messages=[
                {"role": "user", "content": "where is 42?"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "lookup",
                            "input": {"order": 42},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "shipped"}
                    ],
                },
            ],
        )
    (sent,) = server.requests
    assert sent.path == "/v1/messages" and "anthropic-version" in {k.lower() for k in sent.headers}
    parsed = parse_request(sent.body)
    assert parsed.messages == [
        m("system", "Be brief."),
        m("user", "where is 42?"),
        m(
            "assistant",
            tool_calls=[ToolCall(id="toolu_1", name="lookup", arguments='{"order": 42}')],
        ),
        m("tool", "shipped", name="lookup", tool_call_id="toolu_1"),
    ]
    assert parsed.chat is not None and parsed.chat["max_tokens"] == 200
