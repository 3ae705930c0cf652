"""The stored state's byte layout: an open call's entry written by hand is the entry fastavro
writes (the changelogs of earlier versions and the reader stay valid), for any entry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.codec import SchemaRegistry
from streams.errors import DecodeError
from streams.models import AwaitingReward, ClosedCall
from streams.state_codec import ObjectState, OpenCallLayout, entry_key, held_key, is_head_key

LAYOUT = OpenCallLayout(SchemaRegistry.default())
INT = st.integers(min_value=-(2**31), max_value=2**31 - 1)
WHEN = st.none() | st.datetimes(  # hypothesis takes naive bounds, then applies the timezones
    min_value=datetime(1900, 1, 1),  # noqa: DTZ001
    max_value=datetime(2200, 1, 1),  # noqa: DTZ001
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30))]),
)


@given(
    call_id=st.text(),
    partition=INT,
    first_seen=WHEN,
    event_id=st.text(),
    kind=st.sampled_from([0, 1, 2]),
    seq=INT,
    step_count=INT,
    size=INT,
    data=st.binary(max_size=3000),
)
def test_an_entry_is_written_as_fastavro_writes_it(**item: Any) -> None:
    raw = LAYOUT.write(item)
    assert raw == LAYOUT._fastavro(item)
    read = LAYOUT.full(raw)
    assert read["data"] == item["data"] and read["event_id"] == item["event_id"]


def test_entries_of_other_types_are_left_to_fastavro() -> None:
    item = {"call_id": "c", "partition": True, "first_seen": None, "event_id": "e", "kind": 0,
            "seq": 1, "step_count": -1, "size": 1, "data": b"x"}
    assert LAYOUT.write(item) == LAYOUT._fastavro(item)


def test_the_keys_of_a_call_and_a_trace() -> None:
    assert entry_key(b"c1", 0) == b"c1" and entry_key(b"c1", 12) == b"c1\xff12"
    assert is_head_key(b"c1") and not is_head_key(entry_key(b"c1", 1))
    assert held_key(b"t", "s1") == b"t\xffs1" and not is_head_key(held_key(b"t", "s1"))


def test_object_state_keeps_the_record_itself_and_refuses_another_type() -> None:
    # replay's stores hold the state records themselves: what is loaded is what was stored,
    # and a stored record of another type is an error naming both
    state = ObjectState(SchemaRegistry.default())
    closed = ClosedCall(call_id="c1", closed_at=datetime(2026, 1, 1, tzinfo=UTC))
    assert state.load(state.dump(closed), ClosedCall) is closed
    with pytest.raises(DecodeError, match="expected a stored AwaitingReward, got ClosedCall"):
        state.load(closed, AwaitingReward)
    layout = state.open_calls()
    item = {**OpenCallLayout.defaults(), "event_id": "e", "kind": 0, "seq": -1}
    assert layout.full(layout.write(item)) is item
    with pytest.raises(DecodeError, match="OpenCallEvent"):
        layout.light(b"\xc3\x01 bytes")
    assert not state.reads_legacy
