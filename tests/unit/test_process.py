"""streams.process: what a long-lived process does for itself once started."""

from __future__ import annotations

import gc

from streams.process import keep_out_of_collections


class _Kept:
    """An object the start built (tracked by the collector)."""


def test_the_start_is_moved_out_of_the_collectors_generations() -> None:
    kept = _Kept()
    assert gc.is_tracked(kept) and any(o is kept for o in gc.get_objects())
    try:
        keep_out_of_collections()
        assert gc.get_freeze_count() > 0
        # no generation holds it any more: full collections no longer scan it
        assert not any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
