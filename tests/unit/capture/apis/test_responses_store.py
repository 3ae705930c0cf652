"""Unit tests of streams.capture.apis.responses_store: previous_response_id within a call,
bounded, with branches and forgetting."""

from __future__ import annotations

from typing import Any

from streams.capture.apis import ItemStore, output_items
from streams.capture.apis.responses import chat_to_response, parse_request

from .server import chat_completion


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def turn(store: ItemStore, call: str, text: str, previous: str | None, answer_id: str) -> str:
    """One request and its answer, as the gateway handles them; returns the response id."""
    history = store.history(call, previous)
    assert history is not None
    parsed = parse_request({"model": "m", "input": [user(text)]}, history)
    response = chat_to_response(chat_completion(f"re: {text}", chat_id=answer_id), parsed)
    assert store.remember(call, response["id"], parsed.items + output_items(response))
    return str(response["id"])


def test_a_conversation_continues_from_the_response_it_names() -> None:
    store = ItemStore()
    assert store.history("c", None) == []
    first = turn(store, "c", "one", None, "a")
    second = turn(store, "c", "two", first, "b")
    history = store.history("c", second)
    assert history is not None
    parsed = parse_request({"model": "m", "input": [user("three")]}, history)
    assert [(x.role, x.content) for x in parsed.messages] == [
        ("user", "one"),
        ("assistant", "re: one"),
        ("user", "two"),
        ("assistant", "re: two"),
        ("user", "three"),
    ]
    assert store.call_of(first) == store.call_of(second) == "c"


def test_unknown_previous_ids_and_other_calls_are_not_found() -> None:
    store = ItemStore()
    first = turn(store, "c", "one", None, "a")
    assert store.history("c", "resp_nope") is None
    assert store.history("other", first) is None  # a call sees only its own responses


def test_a_branch_cuts_the_log_back_and_forgets_the_responses_after_it() -> None:
    store = ItemStore()
    first = turn(store, "c", "one", None, "a")
    second = turn(store, "c", "two", first, "b")
    branch = turn(store, "c", "two again", first, "c")
    assert store.history("c", second) is None and store.call_of(second) is None
    history = store.history("c", branch)
    assert history is not None and [i.get("content") for i in history][2] == "two again"
    assert len(history) == 4  # one log per call: one, re: one, two again, re: two again


def test_bounds_calls_items_and_bytes() -> None:
    store = ItemStore(max_calls=2, max_items=5, max_bytes=10_000)
    ids = [turn(store, f"c{i}", "hi", None, f"x{i}") for i in range(3)]
    assert len(store) == 2 and store.history("c0", ids[0]) is None  # least recently used went
    assert store.call_of(ids[0]) is None and store.call_of(ids[2]) == "c2"
    second = turn(store, "c2", "more", ids[2], "y")
    history = store.history("c2", second)
    assert history is not None
    too_long = [*history, user("a"), user("b")]
    assert not store.remember("c2", "resp_z", too_long)  # past max_items: not remembered
    assert store.history("c2", "resp_z") is None and store.history("c2", second) is not None
    big = ItemStore(max_bytes=100)
    assert not big.remember("c", "resp_1", [user("x" * 200)])
    assert big.history("c", "resp_1") is None
    store.forget("c2")
    assert store.history("c2", second) is None and store.call_of(second) is None
