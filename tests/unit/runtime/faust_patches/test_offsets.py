"""The consumer patches' offset rules (streams/runtime/faust_patches/offsets.py), pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.runtime.faust_patches.offsets import (
    committable,
    dropped_fetched,
    fetched_gaps,
    reread_from,
)


@pytest.mark.parametrize(
    ("previous", "offsets", "gaps"),
    [
        (None, [], []),
        (None, [5, 6, 7], []),
        (None, [5, 8], [(6, 7)]),
        (4, [5, 6], []),
        (4, [7], [(5, 6)]),
        (4, [4, 5], []),  # fetched again after a seek back: no gap
        (9, [5, 6], []),
    ],
)
def test_fetched_gaps(
    previous: int | None, offsets: list[int], gaps: list[tuple[int, int]]
) -> None:
    assert fetched_gaps(previous, offsets) == gaps


@pytest.mark.parametrize(
    ("committed", "done", "expected"),
    [
        (15, [16, 17], None),  # #606: a one-record hole at the committed offset holds
        (15, [15, 16, 18], 17),
        (0, [1, 2], None),  # upstream skips its test for an offset of 0
        (0, [0, 1], 2),
        (None, [3, 4, 6], None),  # committed offset not known yet: where the run starts isn't
        (10, [3, 4], None),  # stale, below the committed offset
        (10, [8, 9, 10, 11], 12),
        (10, [], None),
    ],
)
def test_committable(committed: int | None, done: list[int], expected: int | None) -> None:
    assert committable(committed, done) == expected


@given(
    committed=st.integers(0, 50),
    done=st.sets(st.integers(0, 80)),
)
def test_a_commit_never_passes_an_offset_not_done(committed: int, done: set[int]) -> None:
    offset = committable(committed, done)
    if offset is not None:
        assert offset > committed
        assert set(range(committed, offset)) <= done


@pytest.mark.parametrize(
    ("seen", "last", "expected"),
    [(52, 79, 53), (-1, 24, 0), (80, 79, None), (79, 79, None), (None, 9, None)],
)
def test_where_a_thrown_away_changelog_fetch_is_read_again(
    seen: int | None, last: int, expected: int | None
) -> None:
    assert reread_from(seen, last) == expected


def test_the_partitions_of_a_fetch_not_all_delivered() -> None:
    fetched = {"a": [4, 5, 6], "b": [1, 2], "c": [], "d": [7]}
    assert dropped_fetched(fetched, {"a": {4, 5, 6}, "b": {1}}) == {"b": 2, "d": 7}
