"""Test-only fault hooks for worker processes, and the entry point that runs a worker with them.

The ``workers`` fixture (:mod:`tests.integration.conftest`) starts a worker given any
``TESTONLY_TRAJSTREAM_*`` variable as ``python -m tests.integration.faults worker``: this module
installs the hooks those variables ask for, then the Faust patches (without the ones a test
removes), then runs ``trajstream worker`` as the product does. The product itself reads none
of these variables.

- ``TESTONLY_TRAJSTREAM_HANDOVER_UNPATCHED=1``: the hand-over patches are left out
  (:data:`streams.runtime.faust_patches.HANDOVER`), to show the loss they prevent.
- ``TESTONLY_TRAJSTREAM_WITHOUT_PATCHES=<name>,...``: these patches are left out (the names of
  :data:`streams.runtime.faust_patches.PATCHES`), to show what one of them prevents.
- ``TESTONLY_TRAJSTREAM_SEEK_DELAY_S=<s>``: sleep between the seek to the committed offsets and
  the reset of the read offsets (inside ``perform_seek``), widening the window in which a
  hand-over loses records.
- ``TESTONLY_TRAJSTREAM_AGENT_DELAY_S=<s>``: every agent sleeps this long per event, so agents
  lag behind the fetcher as on a loaded machine.
- ``TESTONLY_TRAJSTREAM_ACK_LOG=<path>``: append ``topic partition offset`` for every record an
  agent finished with (Faust's acknowledgement), to check that no committed offset passed one.
  It sees ``Consumer.ack``, which Faust's Cython stream iterator inlines: run the worker with
  ``NO_CYTHON=1`` (Faust's own switch) for a complete log. The patches themselves work on the
  bookkeeping both iterators share (``_acked``, ``_acked_index``, ``_gap``).
- ``TESTONLY_TRAJSTREAM_DROP_FETCHED=<topic>:<partition>``: what the consumer fetches of that
  partition never reaches the agents (a partition that makes no progress, as in
  faust-streaming#629: for the progress watch, :mod:`streams.observe.progress`).
- ``TESTONLY_TRAJSTREAM_DROP_BEFORE_SEEK=<topic>``: at the first seek to the committed offsets
  that finds partitions of ``<topic>`` holding records and never committed, the records the
  fetcher has buffered for them are taken and thrown away first, as Faust throws away a fetch
  that returns while a rebalance stops the flow (``consumer.py`` ~758-766, "getmany called
  while flow not active. Seek back to committed offsets"), counting on the seek to read them
  again. The worker logs a warning saying what it dropped.
- ``TESTONLY_TRAJSTREAM_STOP_FLOW_IN_RECOVERY=1``: the first fetch of a table recovery that
  returns changelog records the recovery still needs stops the flow as it returns (as a
  rebalance starting at that moment does) and resumes it a second later, so that Faust's
  ``getmany`` throws the fetch away (~768). The worker logs a warning saying what it returned.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

PREFIX = "TESTONLY_TRAJSTREAM_"
_UNPATCHED = PREFIX + "HANDOVER_UNPATCHED"
_WITHOUT_PATCHES = PREFIX + "WITHOUT_PATCHES"
_SEEK_DELAY = PREFIX + "SEEK_DELAY_S"
_AGENT_DELAY = PREFIX + "AGENT_DELAY_S"
_ACK_LOG = PREFIX + "ACK_LOG"
_DROP_FETCHED = PREFIX + "DROP_FETCHED"
_DROP_BEFORE_SEEK = PREFIX + "DROP_BEFORE_SEEK"
_STOP_FLOW_IN_RECOVERY = PREFIX + "STOP_FLOW_IN_RECOVERY"

_state: dict[str, Any] = {}


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for a hook (or a patch left out)."""
    return any(name.startswith(PREFIX) for name in environ)


def skipped_patches(environ: Mapping[str, str]) -> set[str]:
    """The patches a worker started with ``environ`` runs without."""
    from streams.runtime import faust_patches

    skip = {n for n in environ.get(_WITHOUT_PATCHES, "").split(",") if n}
    if environ.get(_UNPATCHED) == "1":
        skip |= faust_patches.HANDOVER
    return skip


def install(environ: Mapping[str, str]) -> None:
    """The hooks ``environ`` asks for, then the patches but those it leaves out (before the
    worker's own :func:`streams.runtime.faust_patches.install`, which then changes nothing)."""
    _install_hooks(environ)
    from streams.runtime import faust_patches

    faust_patches.install(skip=skipped_patches(environ))


def _install_hooks(env: Mapping[str, str]) -> None:
    seek_delay = float(env.get(_SEEK_DELAY) or 0)
    agent_delay = float(env.get(_AGENT_DELAY) or 0)
    ack_log = env.get(_ACK_LOG)
    drop = env.get(_DROP_FETCHED)
    if drop:
        from faust.transport.consumer import ThreadDelegateConsumer

        topic, _, partition = drop.rpartition(":")
        dropped = (topic, int(partition))
        original_getmany = ThreadDelegateConsumer._getmany

        async def _getmany(self: Any, active_partitions: Any, timeout: float) -> Any:
            records = await original_getmany(self, active_partitions, timeout)
            return {tp: r for tp, r in records.items() if (tp.topic, tp.partition) != dropped}

        ThreadDelegateConsumer._getmany = _getmany  # type: ignore[method-assign]
    drop_before_seek = env.get(_DROP_BEFORE_SEEK)
    if drop_before_seek:
        from faust.transport.consumer import ThreadDelegateConsumer

        original_seek_to_committed = ThreadDelegateConsumer.seek_to_committed

        async def seek_to_committed_dropping(self: Any) -> Mapping[Any, int]:
            if not _state.get("dropped_before_seek"):
                thread = self._thread
                dropped = await thread.call_thread(
                    _drop_fetched, thread._ensure_consumer(), drop_before_seek
                )
                if dropped:
                    _state["dropped_before_seek"] = True
                    self.log.warning(
                        "testonly: dropped fetched records before the seek: %s", dropped
                    )
            return await original_seek_to_committed(self)

        ThreadDelegateConsumer.seek_to_committed = seek_to_committed_dropping  # type: ignore[method-assign]
    if env.get(_STOP_FLOW_IN_RECOVERY) == "1":
        _hook_stop_flow_in_recovery()
    if seek_delay > 0:
        from faust.transport.consumer import ThreadDelegateConsumer

        original_seek = ThreadDelegateConsumer.seek_to_committed

        async def seek_to_committed(self: Any) -> Mapping[Any, int]:
            result = await original_seek(self)
            await asyncio.sleep(seek_delay)
            return result

        ThreadDelegateConsumer.seek_to_committed = seek_to_committed  # type: ignore[method-assign]
    if agent_delay > 0:
        import faust.streams

        async def slow(value: Any) -> Any:
            await asyncio.sleep(agent_delay)
            return value

        original_init = faust.streams.Stream.__init__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            if slow not in self._processors:
                self._processors.insert(0, slow)

        faust.streams.Stream.__init__ = __init__  # type: ignore[method-assign]
    if ack_log:
        from faust.transport.consumer import Consumer

        log: TextIO = open(ack_log, "a", buffering=1)
        original_ack = Consumer.ack

        def ack(self: Any, message: Any) -> bool:
            first = not message.acked
            result: bool = original_ack(self, message)
            if first and message.acked:
                log.write(f"{message.topic} {message.partition} {message.offset}\n")
            return result

        Consumer.ack = ack  # type: ignore[method-assign]


def _seen(offset: int | None) -> int:
    return -1 if offset is None else offset


def _hook_stop_flow_in_recovery() -> None:
    """The first fetch of a recovery that returns changelog records the recovery still needs
    stops the flow as it returns, as a rebalance starting then does, and resumes it a second
    later: Faust's own ``getmany`` throws that fetch away."""
    from faust.transport.consumer import Consumer

    original = Consumer._wait_next_records

    async def _wait_next_records(self: Any, timeout: float) -> Any:
        records, active = await original(self, timeout)
        if records and not _state.get("stopped_flow_in_recovery") and self.app.in_recovery:
            recovery = self.app.tables.recovery
            needed = {
                f"{tp.topic}[{tp.partition}]": f"{recs[0].offset}..{recs[-1].offset}"
                for tp, recs in records.items()
                if recs
                and tp in recovery.active_tps
                and _seen(recovery.active_offsets.get(tp)) < recs[-1].offset
            }
            if needed:
                _state["stopped_flow_in_recovery"] = True
                self.stop_flow()
                asyncio.get_running_loop().call_later(1.0, self.resume_flow)
                self.log.warning(
                    "testonly: stopped the flow as a recovery fetch returned: %s", needed
                )
        return records, active

    Consumer._wait_next_records = _wait_next_records  # type: ignore[method-assign]


async def _drop_fetched(consumer: Any, topic: str, wait_s: float = 10.0) -> dict[str, str]:
    """On the consumer's own thread: take what the aiokafka fetcher buffered for the partitions
    of ``topic`` that hold records and have no committed offset, and throw it away (waits up to
    ``wait_s`` for a first record of each). Returns ``{"topic[p]": "lo..hi"}`` of what went."""
    import time

    tps = [tp for tp in consumer.assignment() if tp.topic == topic]
    if not tps:
        return {}
    ends = await consumer.end_offsets(tps)
    wanted = {tp for tp in tps if ends.get(tp) and await consumer.committed(tp) is None}
    dropped: dict[str, str] = {}
    deadline = time.monotonic() + wait_s
    while wanted and time.monotonic() < deadline:
        fetched = await consumer._fetcher.fetched_records(list(wanted), timeout=0.5)
        for tp, records in fetched.items():
            if records:
                dropped[f"{tp.topic}[{tp.partition}]"] = (
                    f"{records[0].offset}..{records[-1].offset}"
                )
                wanted.discard(tp)
    return dropped


def main(argv: list[str]) -> int:
    """``python -m tests.integration.faults worker``: the hooks of the environment, then the
    command line's ``trajstream``."""
    install(os.environ)
    from streams.cli import main as trajstream

    return trajstream(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
