"""SIGTERM stops a test run as Ctrl-C does, so that every fixture's teardown runs.

Python's default for SIGTERM ends the process at once: no ``finally``, no fixture teardown. The
brokers, registries and workers the fixtures start lead sessions of their own (so that a test
can SIGKILL one with its children), out of reach of a signal sent to pytest's process group: a
run stopped with SIGTERM (a CI job's timeout, ``kill``, a service manager) left them running.
With this handler SIGTERM raises KeyboardInterrupt in pytest's main thread; pytest then ends the
session as after Ctrl-C, tearing down every fixture set up so far. A second SIGTERM ends the
process at once, as before.

Installed by ``tests/conftest.py`` (:func:`install`).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["install"]


def install() -> None:
    """Take SIGTERM in this process, unless someone else already handles it."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the run at once
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")
