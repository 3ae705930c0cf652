"""Every patch of faust-streaming and aiokafka, installed by one :func:`install` behind one
version gate.

The worker runs faust-streaming 0.15.3 exactly (:data:`FAUST_VERSION`); the Faust
patches replace methods with copies of that version's code, so :func:`install` refuses any
other version (:class:`~streams.errors.HandoverPatchError`). The aiokafka patch checks the
source it replaces itself (:mod:`.metadata`). Each patch is one ``install_*`` function whose
docstring names the upstream behaviour and issue it works around and the test that fails
without it; :data:`PATCHES` lists them by name.

The main one is the record loss at a partition hand-over. Records of a partition produced
around a hand-over could be skipped for good, with the group's committed offset moving past
them; it shows under CPU load (the agent must lag behind the fetcher). As read in the installed
0.15.3 (its line numbers):

1. ``tables/recovery.py`` ``Recovery.on_recovery_completed`` (~649) resumes the stream
   partitions while the fetcher and flow control already run: records are handed to the agents'
   queues and ``Consumer._read_offset`` advances (``transport/consumer.py`` ~1223).
2. It then seeks to the committed offsets (``Consumer.perform_seek`` ~566): the read offsets are
   reset while deliveries go on; the records delivered between the seek and that reset advance
   them again and are then forgotten by the reset.
3. ``app.flow_control.resume()`` (~659) clears every agent's input queue (``mode/utils/queues.py``
   ``FlowControlEvent.resume`` ~97; channels are built with ``clear_on_resume=True``): records
   delivered but not yet taken vanish, never acknowledged. Fetched again, those below the read
   offset are dropped as already read (``consumer.py`` ~1209/1226).
4. The commit then passes them: the next delivery records a "gap" from the reset read offset to
   its own offset (~1215), and ``Consumer._new_offset`` counts gaps as acknowledged (~1117); or a
   hole of one record right at the committed offset passes ``min(acked) - committed > 1`` (~1140,
   the off-by-one of faust-streaming#606; an offset of 0 even skips the test, ``if committed``).

Upstream: faust-streaming/faust#596 (gaps in acked offsets that skew commits, open), #606 (the
off-by-one, fix PR #707 not merged), #216/#217 and #221/#223 (earlier hand-over fixes whose
order this keeps), #629 (a recovery that waits for ever). The patches, in the order a record
flows: :mod:`.recovery` (the queues cleared before the partitions are resumed), then
:mod:`.consumer` (gaps learnt from fetches, the commit a contiguous run from the committed
offset, the seek that keeps it and knows where a never-committed partition starts, no input
record dropped as read already, changelog records thrown away during a recovery read again),
over the pure rules of :mod:`.offsets`. Then the producer (:mod:`.producer`: idempotence, the
metadata of its own topics) and aiokafka's metadata synchroniser (:mod:`.metadata`: a failed
update backs off).

The tests that show what a patch prevents run a worker without it: they install the patches
first with ``skip`` (``tests/integration/faults.py``, with the test-only fault hooks that widen
each race); production calls :func:`install` once, before the Faust app is built, and reads no
test variable.

May import: faust, mode, aiokafka, the standard library, :mod:`streams.errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from importlib.metadata import version as _distribution_version

from ...errors import HandoverPatchError
from . import consumer, producer, recovery
from .metadata import install_metadata_backoff

__all__ = ["FAUST_VERSION", "HANDOVER", "PATCHES", "HandoverPatchError", "install", "installed"]

FAUST_VERSION = "0.15.3"
"""The only faust-streaming version these patches were read against and tested with."""

PATCHES: dict[str, Callable[[], object]] = {
    "recovery.clear_queues_first": recovery.install_clear_queues_first,
    "consumer.gaps_from_fetches": consumer.install_gaps_from_fetches,
    "consumer.contiguous_commit": consumer.install_contiguous_commit,
    "consumer.seek_keeps_committed": consumer.install_seek_keeps_committed,
    "consumer.no_drop_as_read": consumer.install_no_drop_as_read,
    "consumer.reread_thrown_changelogs": consumer.install_reread_thrown_changelogs,
    "producer.idempotence": producer.install_idempotence,
    "producer.topic_tracking": producer.install_topic_tracking,
    "metadata.backoff": install_metadata_backoff,
}
"""Every patch by name, in the order :func:`install` applies them."""

HANDOVER = frozenset(name for name in PATCHES if name.split(".")[0] in ("recovery", "consumer"))
"""The patches that close the loss at a hand-over (the recovery's and the consumer's)."""

_installed: frozenset[str] | None = None


def installed() -> frozenset[str]:
    """The names of the patches installed in this process (none before :func:`install`)."""
    return _installed or frozenset()


def install(*, skip: Collection[str] = ()) -> None:
    """Install every patch of :data:`PATCHES` but those named in ``skip`` (a test that shows
    what a patch prevents), once per process: a later call changes nothing. Call it before the
    Faust app is built.

    Raises :class:`HandoverPatchError` on a faust-streaming version other than
    :data:`FAUST_VERSION`: the patched methods are copies of that version's code.
    """
    global _installed
    version = _distribution_version("faust-streaming")
    if version != FAUST_VERSION:
        raise HandoverPatchError(
            f"streams.runtime.faust_patches patches faust-streaming {FAUST_VERSION}, found "
            f"{version}: re-read the code each patch copies from that version (see the "
            f"docstrings of streams/runtime/faust_patches/) and update the patches, or install "
            f"faust-streaming=={FAUST_VERSION}"
        )
    if _installed is not None:
        return
    unknown = set(skip) - PATCHES.keys()
    if unknown:
        raise ValueError(f"no such patch: {sorted(unknown)}; the patches: {list(PATCHES)}")
    for name, patch in PATCHES.items():
        if name not in skip:
            patch()
    _installed = frozenset(PATCHES.keys() - set(skip))
