"""acked mode on the Responses and Messages streams: the last whole event (the terminal one)
is held back until the step is on the broker, whatever the split of the bytes."""

from __future__ import annotations

import pytest

from streams.capture.apis.sse import HoldLast

EVENTS = b"event: a\ndata: 1\n\nevent: b\r\ndata: 2\r\n\r\nevent: response.completed\ndata: 3\n\n"


@pytest.mark.parametrize("size", [1, 3, 7, len(EVENTS)])
def test_every_event_but_the_last_passes_and_the_last_is_released_whole(size: int) -> None:
    hold = HoldLast()
    sent = b"".join(hold.feed(EVENTS[i : i + size]) for i in range(0, len(EVENTS), size))
    assert sent == EVENTS[: EVENTS.index(b"event: response.completed")]
    assert hold.release() == b"event: response.completed\ndata: 3\n\n"
    assert hold.release() == b""
