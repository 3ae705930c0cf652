"""The gateway's pure parts: routing decisions, step extraction, stream assembly, spill files."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from streams.capture.chat import StreamAssembler, ask_usage, llm_step, steps_of_request
from streams.capture.gateway import parse_messages
from streams.capture.publisher import SpillFiles
from streams.capture.routing import check_routable, decide_route
from streams.errors import BadRequest, ConfigError, GatewayError, TrajstreamError
from streams.models import Selection, StepKind, ToolCall
from streams.select import CallView, build_strategy, sample_point
from tests.unit.factories import T0, mark, start


@pytest.mark.parametrize(
    "spec",
    [
        "sampling:0.2",
        "marked",
        "any(marked,sampling:0.1)",
        "all(marked,sampling)",
        "per-agent(a=sampling:1,*=marked)",
    ],
)
def test_built_in_strategies_that_decide_at_the_start_can_route(spec: str) -> None:
    check_routable(build_strategy(spec))


class _AtEnd:
    name = "at-end"

    def decide(self, call: CallView) -> Selection:
        return Selection(selected=call.end is not None, strategy=self.name, reason="x")


class _AtStart(_AtEnd):
    decides_at_start = True


@pytest.mark.parametrize(
    ("strategy", "why"),
    [
        (build_strategy("per-model(m=sampling,*=marked)"), "model of the call's last step"),
        (_AtEnd(), "decides_at_start"),
        (build_strategy("any(marked,x.y:Z)", loader=lambda _: _AtEnd), "decides_at_start"),
    ],
)
def test_strategies_that_need_the_finished_call_are_refused(strategy, why: str) -> None:
    with pytest.raises(ConfigError, match="cannot route calls") as caught:
        check_routable(strategy)
    assert why in str(caught.value)


def test_a_plugin_that_declares_it_decides_at_start_routes() -> None:
    check_routable(_AtStart())


def test_the_decision_is_the_hash_and_the_mark_never_the_clock() -> None:
    strategy = build_strategy("any(marked,sampling:0.5)", mark_ttl=timedelta(seconds=1))
    for i in range(200):
        cid = f"c{i}"
        early = decide_route(strategy, start(cid, event_time=T0, mark=None), "route")
        late = decide_route(
            strategy, start(cid, event_time=T0 + timedelta(hours=1), mark=None), "route"
        )
        assert early == late
        assert early.selection.selected == (sample_point(cid) < 0.5)
        assert early.upstream == ("trinity" if early.selection.selected else "production")
    marked = start("c-unlucky", event_time=T0 + timedelta(hours=1), mark=mark(marked_at=T0))
    route = decide_route(strategy, marked, "shadow")
    assert route.selection.selected and route.shadow and route.upstream == "production"
    assert route.attributes()["trajstream.route.selected"] == "true"


def test_tool_messages_after_the_last_assistant_turn_are_tool_steps() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
    ]
    (tool,) = steps_of_request("c", messages, T0)
    assert (tool.seq, tool.kind, tool.tool_name, tool.tool_call_id) == (
        2,
        StepKind.TOOL,
        "lookup",
        "call_1",
    )
    assert steps_of_request("c", messages[:1], T0) == []
    step = llm_step(
        "c",
        {"model": "m", "messages": messages},
        {"id": "r", "choices": []},
        upstream="trinity",
        latency_ms=1.0,
        now=T0,
    )
    assert step.seq == 3 and step.input_messages[1].tool_calls == [
        ToolCall(id="call_1", name="lookup")
    ]


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"model": "m"},
        {"messages": []},
        {"messages": [{"content": "x"}]},
        {"messages": [{"role": "user"}], "model": 3},
        {"messages": [{"role": "user"}], "stream": "yes"},
    ],
)
def test_requests_without_usable_messages_are_refused(body) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_messages(body)
    # under the one root, as every gateway error: a caller catches GatewayError or the root
    assert isinstance(refused.value, GatewayError) and isinstance(refused.value, TrajstreamError)
    assert refused.value.status == 400


def test_streamed_chunks_add_up_to_the_completion() -> None:
    def sse(chunk: dict) -> bytes:
        return f"data: {json.dumps(chunk)}\r\n\r\n".encode()

    chunks = [
        {
            "id": "r1",
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "He"}}],
        },
        {
            "id": "r1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "content": "llo",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_9",
                                "function": {"name": "look", "arguments": '{"q"'},
                            }
                        ],
                    },
                }
            ],
        },
        {
            "id": "r1",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "function": {"name": "up", "arguments": ": 1}"}}
                        ]
                    },
                    "finish_reason": "tool_calls",
                }
            ],
        },
        {"id": "r1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    data = b"".join(sse(c) for c in chunks) + b"data: [DONE]\n\n"
    assembler = StreamAssembler()
    for i in range(0, len(data), 7):  # arbitrary network cuts
        assembler.feed(data[i : i + 7])
    assert assembler.done
    out = assembler.completion()
    assert out["id"] == "r1" and out["usage"]["prompt_tokens"] == 3
    message = out["choices"][0]["message"]
    assert message["content"] == "Hello"
    assert message["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q": 1}'}
    assert out["choices"][0]["finish_reason"] == "tool_calls"


def test_a_stream_asks_for_usage_and_a_client_that_did_not_ask_never_sees_it() -> None:
    body = {"messages": [], "stream": True, "stream_options": {"x": 1}}
    sent, asked = ask_usage(body)
    assert not asked and sent["stream_options"] == {"x": 1, "include_usage": True}
    assert body["stream_options"] == {"x": 1}  # the client's body is not changed
    assert ask_usage({"stream": True})[0]["stream_options"] == {"include_usage": True}
    mine = {"stream": True, "stream_options": {"include_usage": True}}
    assert ask_usage(mine) == (mine, True)

    chunks = [
        {"id": "r1", "choices": [{"index": 0, "delta": {"content": "Hi"}}], "usage": None},
        {"id": "r1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"id": "r1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    events = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
    data = b": keep-alive\n\n" + b"".join(events) + b"data: [DONE]\n\n"
    for strip in (True, False):
        assembler = StreamAssembler(strip_usage=strip)
        forwarded = b"".join(assembler.feed(data[i : i + 5]) for i in range(0, len(data), 5))
        forwarded += assembler.rest()
        assert assembler.completion()["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}
        expected = data.replace(events[2], b"") if strip else data
        assert forwarded == expected
    held = StreamAssembler(hold_done=True)  # acked mode: the end only once recorded
    forwarded = held.feed(data)
    assert forwarded == data.replace(b"data: [DONE]\n\n", b"") and held.done
    assert held.done_event == b"data: [DONE]\n\n"
    torn = StreamAssembler(strip_usage=True)
    assert torn.feed(events[0] + b"data: {") == events[0] and torn.rest() == b"data: {"


def test_spill_files_read_back_in_order_across_restarts_and_skip_a_torn_frame(
    tmp_path: Path,
) -> None:
    spill = SpillFiles(tmp_path)
    for i in range(5):
        spill.append(("t", b"k", f"v{i}".encode()))
    spill.close()
    with (sorted(tmp_path.glob("spill-*.bin"))[-1]).open("ab") as fh:
        fh.write(b"\x00\x00\x00\x01t\x00\x00")  # a crash mid-write
    again = SpillFiles(tmp_path)
    assert again.records == 5
    got = []
    while again:
        batch = again.peek(2)
        got += [f[2] for f, _ in batch]
        again.consume(len(batch), batch[-1][1])
    assert got == [f"v{i}".encode() for i in range(5)]
    assert again.peek(2) == [] and not list(tmp_path.glob("spill-*.bin"))
