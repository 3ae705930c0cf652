"""Unit tests of streams.capture.apis.responses_stream: streamed Responses API answers put back
together (every event type the official client's ``responses.create(stream=True)`` yields for
text, refusals, reasoning and function calls; each fixture event checked against the client's
own event types, each result against the client's own stream accumulator), and Trinity's
streamed chat completion told as those events to the real client and the Agents SDK."""

from __future__ import annotations

import json
import typing
from typing import Any

import openai
import pytest
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from streams.capture.apis import (
    ChatToResponsesStream,
    ResponsesStreamAssembler,
    answer_of_chat,
    answer_of_response,
)
from streams.capture.apis.responses import parse_request
from streams.capture.apis.sse import encode_event

from .server import chat_completion, chat_stream, serve

EVENT_TYPES = {
    cls.model_fields["type"].annotation.__args__[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def validated(event: dict[str, Any]) -> Any:
    """The event as the client's own type for it, validated strictly (a terminal response
    without output, which the client's accumulator recovers from, checked with an empty one
    and then handed over as sent)."""
    response = event.get("response")
    if isinstance(response, dict) and response.get("output") is None:
        EVENT_TYPES[event["type"]].model_validate({**event, "response": {**response, "output": []}})
        return EVENT_TYPES[event["type"]].construct(**event)
    return EVENT_TYPES[event["type"]].model_validate(event)


TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "strict": False}


def base(status: str = "in_progress", output: list[Any] | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "id": "resp_9",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "gpt-5",
        "output": output if output is not None else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        **kw,
    }


USAGE = {
    "input_tokens": 5,
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 1},
    "total_tokens": 8,
}


def sequence(*events: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**e, "sequence_number": i} for i, e in enumerate(events)]


def text_events(text: str = "It shipped.", index: int = 0) -> list[dict[str, Any]]:
    item = {
        "type": "message",
        "id": "msg_9",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    done = {**item, "status": "completed", "content": [{**part, "text": text}]}
    common = {"item_id": "msg_9", "output_index": index, "content_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.content_part.added", **common, "part": part},
        *(
            {
                "type": "response.output_text.delta",
                **common,
                "delta": text[i : i + 4],
                "logprobs": [],
            }
            for i in range(0, len(text), 4)
        ),
        {"type": "response.output_text.done", **common, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **common, "part": {**part, "text": text}},
        {"type": "response.output_item.done", "output_index": index, "item": done},
    ], [done]


def call_events(
    index: int, call_id: str, args: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    item = {
        "type": "function_call",
        "id": f"fc_{index}",
        "call_id": call_id,
        "name": "lookup",
        "arguments": "",
        "status": "in_progress",
    }
    done = {**item, "arguments": args, "status": "completed"}
    common = {"item_id": f"fc_{index}", "output_index": index}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        *(
            {"type": "response.function_call_arguments.delta", **common, "delta": args[i : i + 3]}
            for i in range(0, len(args), 3)
        ),
        {
            "type": "response.function_call_arguments.done",
            **common,
            "arguments": args,
            "name": "lookup",
        },
        {"type": "response.output_item.done", "output_index": index, "item": done},
    ], [done]


def reasoning_events(index: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    item = {"type": "reasoning", "id": "rs_9", "summary": [], "status": "in_progress"}
    done = {
        **item,
        "summary": [{"type": "summary_text", "text": "check it"}],
        "status": "completed",
    }
    common = {"item_id": "rs_9", "output_index": index, "summary_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {
            "type": "response.reasoning_summary_part.added",
            **common,
            "part": {"type": "summary_text", "text": ""},
        },
        {"type": "response.reasoning_summary_text.delta", **common, "delta": "check "},
        {"type": "response.reasoning_summary_text.delta", **common, "delta": "it"},
        {"type": "response.reasoning_summary_text.done", **common, "text": "check it"},
        {
            "type": "response.reasoning_summary_part.done",
            **common,
            "part": {"type": "summary_text", "text": "check it"},
        },
        {"type": "response.output_item.done", "output_index": index, "item": done},
    ], [done]


def refusal_events() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    item = {
        "type": "message",
        "id": "msg_r",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    part = {"type": "refusal", "refusal": ""}
    done = {**item, "status": "completed", "content": [{"type": "refusal", "refusal": "No."}]}
    common = {"item_id": "msg_r", "output_index": 0, "content_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **common, "part": part},
        {"type": "response.refusal.delta", **common, "delta": "No"},
        {"type": "response.refusal.delta", **common, "delta": "."},
        {"type": "response.refusal.done", **common, "refusal": "No."},
        {
            "type": "response.content_part.done",
            **common,
            "part": {"type": "refusal", "refusal": "No."},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    ], [done]


def stream_case(name: str) -> list[dict[str, Any]]:
    created = [
        {"type": "response.created", "response": base()},
        {"type": "response.in_progress", "response": base()},
    ]
    if name == "text":
        events, out = text_events()
        end = {"type": "response.completed", "response": base("completed", out, usage=USAGE)}
    elif name == "completed-without-output":
        events, out = text_events()
        end = {
            "type": "response.completed",
            "response": {**base("completed", usage=USAGE), "output": None},
        }
    elif name == "reasoning-and-two-calls":
        r, rout = reasoning_events(0)
        a, aout = call_events(1, "call_a", '{"order": 42}')
        b, bout = call_events(2, "call_b", '{"order": 7}')
        events, out = r + a + b, rout + aout + bout
        end = {"type": "response.completed", "response": base("completed", out, usage=USAGE)}
    elif name == "refusal":
        events, out = refusal_events()
        end = {"type": "response.completed", "response": base("completed", out, usage=USAGE)}
    elif name == "incomplete":
        events, out = text_events("It ship")
        details = {"reason": "max_output_tokens"}
        end = {
            "type": "response.incomplete",
            "response": base("incomplete", out, incomplete_details=details, usage=USAGE),
        }
    else:
        raise AssertionError(name)
    return sequence(*created, *events, end)


CASES = ["text", "completed-without-output", "reasoning-and-two-calls", "refusal", "incomplete"]


def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(encode_event(e) for e in events)


@pytest.mark.parametrize("name", CASES)
def test_a_streamed_response_is_put_back_together_as_the_client_does(name: str) -> None:
    events = stream_case(name)
    parsed = [validated(e) for e in events]  # the fixtures are real event types
    oracle = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for event in parsed:
        oracle.handle_event(event)
    # the client's own view of the finished items (what it recovers a final response from),
    # and its final response when the stream completed
    done = oracle._completed_output
    expected = [done[i].to_dict() for i in sorted(done)]
    if oracle._completed_response is not None:
        final = [o.to_dict() for o in oracle._completed_response.output]
        assert [_essential(o) for o in final] == [_essential(o) for o in expected]
    data = sse(events)
    for size in (1, 7, 64, len(data)):  # any split of the bytes
        assembler = ResponsesStreamAssembler()
        for i in range(0, len(data), size):
            assembler.feed(data[i : i + size])
        assert assembler.done
        got = assembler.response()
        assert [_essential(o) for o in got["output"]] == [_essential(o) for o in expected]
        assert got["status"] == events[-1]["response"]["status"]


def _essential(item: dict[str, Any]) -> dict[str, Any]:
    """What records read of an output item."""
    keep = {"type", "id", "call_id", "name", "arguments", "role"}
    out = {k: v for k, v in item.items() if k in keep}
    for key in ("content", "summary"):
        if item.get(key):
            out[key] = [
                {k: p.get(k) for k in ("type", "text", "refusal") if p.get(k) is not None}
                for p in item[key]
            ]
    return out


def test_an_answer_streamed_is_recorded_like_the_same_answer_whole() -> None:
    events = stream_case("reasoning-and-two-calls")
    assembler = ResponsesStreamAssembler()
    assembler.feed(sse(events))
    streamed = answer_of_response(assembler.response())
    whole = answer_of_response(events[-1]["response"])
    assert streamed == whole
    assert [c.id for c in streamed.message.tool_calls] == ["call_a", "call_b"]
    assert streamed.message.reasoning == "check it" and streamed.finish_reasons == ["tool_calls"]


def test_a_stream_without_its_terminal_event_is_not_done_and_errors_are_kept() -> None:
    events = stream_case("text")[:-1]
    assembler = ResponsesStreamAssembler()
    assembler.feed(
        sse(events)
        + encode_event(
            {
                "type": "error",
                "code": "server_error",
                "message": "boom",
                "param": None,
                "sequence_number": 99,
            }
        )
    )
    assert not assembler.done and assembler.error == {
        "code": "server_error",
        "message": "boom",
        "param": None,
    }
    assert answer_of_response(assembler.response()).message.content == "It shipped."


# -- Trinity's chat stream told as Responses events -------------------------------------------

CHATS = {
    "text": chat_completion("Order 42 shipped yesterday."),
    "reasoning-then-text": chat_completion("Shipped.", reasoning="I should check the order."),
    "parallel-tools-interleaved": chat_completion(
        None,
        tool_calls=[("call_1", "lookup", '{"order": 42}'), ("call_2", "lookup", '{"order": 7}')],
    ),
    "text-and-tool": chat_completion(
        "Looking.", tool_calls=[("call_1", "lookup", '{"order": 42}')]
    ),
    "length": chat_completion("Cut sho", finish="length"),
    "empty": chat_completion(""),
}


@pytest.mark.parametrize("name", list(CHATS))
async def test_trinitys_stream_reaches_the_official_client_as_typed_events(name: str) -> None:
    completion = CHATS[name]
    body = {"model": "gpt-5", "input": "where is 42?", "tools": [TOOL], "stream": True}
    parsed = parse_request(body)
    translator = ChatToResponsesStream(parsed, created_at=1)
    chat_bytes = chat_stream(completion, interleave=True)
    out = b""
    for i in range(0, len(chat_bytes), 50):
        out += translator.feed(chat_bytes[i : i + 50])
    out += translator.finish()
    # the chat side adds up to Trinity's completion: the record, with its msg_id
    assert answer_of_chat(translator.completion()) == answer_of_chat(completion)
    async with (
        serve(out, out) as server,
        openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused") as client,
    ):
        events = [e async for e in await client.responses.create(**body)]
        # the client's accumulator, with its checks of order and identity; it wants a
        # response.completed, so a response cut at its token limit is only iterated
        if name != "length":
            async with client.responses.stream(
                model="gpt-5",
                input="where is 42?",
                tools=[TOOL],  # type: ignore[list-item]
            ) as stream:
                async for _ in stream:
                    pass
                final = await stream.get_final_response()
    sent = parse_request(server.requests[0].body)  # what the client sent, streamed
    assert sent.stream and sent.chat is not None and sent.chat["stream_options"]["include_usage"]
    assert sent.chat["tools"][0]["function"]["name"] == "lookup"
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.incomplete" if name == "length" else "response.completed")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    told = translator.response()
    message = completion["choices"][0]["message"]
    if name != "length":
        assert final.id == "resp_chatcmpl-1" and final.output_text == (message["content"] or "")
        calls = [(o.call_id, o.arguments) for o in final.output if o.type == "function_call"]
        wanted = [(c["id"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert calls == wanted
        client_output = json.loads(final.model_dump_json())["output"]
        assert [_essential(o) for o in client_output] == [_essential(o) for o in told["output"]]
    else:
        assert told["status"] == "incomplete"
        assert told["incomplete_details"] == {"reason": "max_output_tokens"}
    assert answer_of_response(told).message == answer_of_chat(completion).message
    again = ResponsesStreamAssembler()
    again.feed(out)
    assert again.done and answer_of_response(again.response()) == answer_of_response(told)


def test_a_broken_chat_stream_is_a_failed_response() -> None:
    translator = ChatToResponsesStream(parse_request({"model": "m", "input": "hi", "stream": True}))
    half = chat_stream(chat_completion("Half an answer"))[:300]
    out = translator.feed(half) + translator.fail("upstream closed the stream")
    assembler = ResponsesStreamAssembler()
    assembler.feed(out)
    assert assembler.done and assembler.response()["status"] == "failed"
    assert translator.finish() == b""  # nothing after the terminal event


async def test_an_agents_sdk_streamed_run_with_a_function_tool() -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def lookup(order: int) -> str:
        """Look an order up."""
        return f"order {order} shipped"

    chats = [
        chat_completion(
            None, tool_calls=[("call_1", "lookup", '{"order": 42}')], chat_id="chatcmpl-a"
        ),
        chat_completion("Order 42 shipped.", chat_id="chatcmpl-b"),
    ]
    told: list[dict[str, Any]] = []

    def answer(body: dict[str, Any]) -> bytes:
        parsed = parse_request(body)
        assert parsed.stream and parsed.chat is not None, parsed.unsupported
        translator = ChatToResponsesStream(parsed)
        out = translator.feed(chat_stream(chats.pop(0))) + translator.finish()
        told.append(translator.response())
        return out

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
        result = Runner.run_streamed(agent, "Where is order 42?")
        async for _ in result.stream_events():
            pass
    assert result.final_output == "Order 42 shipped."
    second = parse_request(server.requests[1].body)
    assert second.messages[-1].role == "tool" and second.messages[-1].content == "order 42 shipped"
    assert [t["id"] for t in told] == ["resp_chatcmpl-a", "resp_chatcmpl-b"]
