"""What the gateway keeps of a call's Responses API items, so that ``previous_response_id``
works within a call whichever upstream answered (Trinity keeps nothing; a recorded step needs
the whole conversation; a shadow request to Trinity too).

:class:`ItemStore` is pure and bounded: per call, one conversation log (the items in order) and
the length of the log after each response, so a conversation of n responses costs n items,
not n squared. A request that continues an earlier response than the last (a branch) cuts the
log back to it and forgets the responses after it. At most ``max_calls`` calls are kept (least
recently used dropped), each at most ``max_items`` items and ``max_bytes`` of item JSON; a
response past those bounds is not remembered, so a later ``previous_response_id`` naming it is
not found (the gateway answers 400 ``previous_response_not_found``, as OpenAI does for a
response it does not have), never silently continued from a wrong history.

Example::

    store = ItemStore(max_calls=10_000)
    history = store.history("call-1", None)                 # []: a first request
    store.remember("call-1", "resp_a", parsed.items + output_items(response))
    store.history("call-1", "resp_a")                        # those items
    store.call_of("resp_a")                                  # "call-1"

May import: the standard library.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ItemStore"]


@dataclass
class _Call:
    items: list[dict[str, Any]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    ends: dict[str, int] = field(default_factory=dict)
    """Response id -> the log's length after that response."""


class ItemStore:
    """Bounded per-call memory of Responses API items; see the module docstring."""

    def __init__(
        self, *, max_calls: int = 10_000, max_items: int = 2_048, max_bytes: int = 8 << 20
    ) -> None:
        self.max_calls = max_calls
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._owner: dict[str, str] = {}

    def history(
        self, call_id: str, previous_response_id: str | None
    ) -> list[dict[str, Any]] | None:
        """The items before a request: ``[]`` without a previous response, None when the
        previous response is unknown in this call (never stored, or forgotten)."""
        if not previous_response_id:
            return []
        call = self._calls.get(call_id)
        if call is None or previous_response_id not in call.ends:
            return None
        self._calls.move_to_end(call_id)
        return list(call.items[: call.ends[previous_response_id]])

    def remember(self, call_id: str, response_id: str, conversation: list[dict[str, Any]]) -> bool:
        """Remember the whole conversation after ``response_id`` (input and output items);
        returns False when it is past the bounds (then it is not remembered)."""
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = _Call()
        self._calls.move_to_end(call_id)
        # the longest stored prefix this conversation extends
        common = 0
        while (
            common < len(call.items)
            and common < len(conversation)
            and call.items[common] == conversation[common]
        ):
            common += 1
        sizes = call.sizes[:common] + [
            len(json.dumps(item, separators=(",", ":"))) for item in conversation[common:]
        ]
        if len(conversation) > self.max_items or sum(sizes) > self.max_bytes:
            self._forget_after(call, common)
            call.items, call.sizes = call.items[:common], call.sizes[:common]
            return False
        self._forget_after(call, common)
        call.items = call.items[:common] + [dict(i) for i in conversation[common:]]
        call.sizes = sizes
        call.ends[response_id] = len(conversation)
        self._owner[response_id] = call_id
        while len(self._calls) > self.max_calls:
            _, dropped = self._calls.popitem(last=False)
            for rid in dropped.ends:
                self._owner.pop(rid, None)
        return True

    def call_of(self, response_id: str) -> str | None:
        """The call a stored response belongs to (for a request without a call id that
        continues a response)."""
        return self._owner.get(response_id)

    def forget(self, call_id: str) -> None:
        """Drop a call (its END was published)."""
        call = self._calls.pop(call_id, None)
        for rid in call.ends if call else ():
            self._owner.pop(rid, None)

    def __len__(self) -> int:
        return len(self._calls)

    def _forget_after(self, call: _Call, length: int) -> None:
        """Forget the responses whose conversation is not a prefix of the first ``length``
        items (a branch cut them off)."""
        for rid, end in list(call.ends.items()):
            if end > length:
                del call.ends[rid]
                self._owner.pop(rid, None)
