"""A worker under tracemalloc, for ``bench/run.py --trace-memory DIR``: where memory goes.

    python bench/traced_worker.py DIR worker [trajstream worker options]

Starts tracing (8 frames) before anything is imported, then runs the trajstream CLI. A thread
watches DIR: for each file ``<name>.want`` the bench creates, it takes a snapshot and writes
``<name>.txt``: the top allocators (by line and by traceback) against the first snapshot it
took (``base.want``, the bench asks for it after warm-up), so the lines say what grew since,
and against the one before it; and the whole snapshot as ``<name>.snapshot``
(``tracemalloc.Snapshot.load``) to compare any two afterwards.

With ``TRACE_FROM_BASE=1`` in the environment, tracing starts only at ``base.want`` (the
worker runs at full speed until then; the soak uses it, as a worker traced from its start
falls behind a steady load): every dump then holds only what was allocated since the base and
is still alive, and the comparison of two later dumps is exact for what they allocated.
``TRACE_FRAMES`` sets the frames kept per allocation (default 8).

With ``TRACE_CENSUS=1`` nothing is traced (no cost between dumps): each dump is a census
instead, ``<name>.txt``: glibc's malloc statistics (``mallinfo2``: bytes in use and bytes free
but kept), Python objects by type (count and ``sys.getsizeof``), and the containers that grew
most since the previous census (by identity), each with what refers to it.

Tracing costs CPU (the worker is slower under it): use it to find allocators, not to time.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = int(os.environ.get("TRACE_FRAMES", "8"))
FROM_BASE = os.environ.get("TRACE_FROM_BASE") == "1"
CENSUS = os.environ.get("TRACE_CENSUS") == "1"
if not FROM_BASE and not CENSUS:
    tracemalloc.start(FRAMES)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
taken: list[tracemalloc.Snapshot] = []
ROOTS = ("site-packages/", "/lib/python3")


def _where(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    for root in ROOTS:
        if root in name:
            name = name.split(root, 1)[1]
            break
    else:
        name = "/".join(Path(name).parts[-3:])
    return f"{name}:{frame.lineno}"


def _rss() -> int:
    return next(
        int(x.split()[1]) * 1024
        for x in Path("/proc/self/status").read_text().splitlines()
        if x.startswith("VmRSS:")
    )


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (f, ctypes.c_size_t)
        for f in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo() -> str:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return "mallinfo2: not available"
    return (
        f"malloc: heap {m.arena:,} B (in use {m.uordblks:,}, free kept {m.fordblks:,}, "
        f"trimmable {m.keepcost:,}), mmapped {m.hblkhd:,} B in {m.hblks} blocks"
    )


_sizes: dict[int, tuple[str, int]] = {}


def _owner(obj: object, skip: set[int]) -> str:
    """Who refers to ``obj``: an attribute of an instance, a key of a dict, or a type."""
    for ref in gc.get_referrers(obj):
        if id(ref) in skip or isinstance(ref, type(sys._getframe())):
            continue
        if isinstance(ref, dict):
            for holder in gc.get_referrers(ref):
                if getattr(holder, "__dict__", None) is ref:
                    for attr, value in ref.items():
                        if value is obj:
                            kind = type(holder)
                            return f"{kind.__module__}.{kind.__qualname__}.{attr}"
            for attr, value in ref.items():
                if value is obj:
                    return f"dict[{attr!r:.60}]"
        try:
            attrs = vars(ref)
        except TypeError:
            attrs = {}
        for attr, value in list(attrs.items()):
            if value is obj:
                return f"{type(ref).__module__}.{type(ref).__qualname__}.{attr}"
        for attr in getattr(type(ref), "__slots__", ()):
            if getattr(ref, attr, None) is obj:
                return f"{type(ref).__module__}.{type(ref).__qualname__}.{attr}"
        return f"a {type(ref).__module__}.{type(ref).__qualname__}"
    return "?"


CONTAINERS = (dict, list, set, collections.deque, collections.OrderedDict, bytearray)


def _census(name: str) -> None:
    gc.collect()
    objects = gc.get_objects()
    by_type: dict[str, list[int]] = {}
    sized: dict[int, tuple[str, int]] = {}
    found: dict[int, object] = {}

    def consider(obj: object) -> None:
        if type(obj) in CONTAINERS and id(obj) not in sized:
            n = len(obj)  # type: ignore[arg-type]
            if n >= 64:
                sized[id(obj)] = (type(obj).__qualname__, n)
                found[id(obj)] = obj

    for obj in objects:
        kind = type(obj)
        entry = by_type.setdefault(f"{kind.__module__}.{kind.__qualname__}", [0, 0])
        entry[0] += 1
        try:
            entry[1] += sys.getsizeof(obj)
        except TypeError:
            pass
        consider(obj)
        # dicts and lists of atoms only (a table's bytes -> bytes) are not tracked by gc
        for ref in gc.get_referents(obj):
            if not gc.is_tracked(ref):
                consider(ref)
    skip = {id(objects), id(found), id(sized), id(_sizes)}
    lines = [f"# {name}: RSS {_rss():,} B, gc objects {len(objects):,}", _mallinfo()]
    lines.append("## types by getsizeof (count, bytes)")
    top = sorted(by_type.items(), key=lambda kv: -kv[1][1])[:30]
    lines.extend(f"{size:>14,} B {count:>10,}  {kind}" for kind, (count, size) in top)
    if _sizes:
        grew = sorted(
            ((n - _sizes[i][1], i, kind, n) for i, (kind, n) in sized.items() if i in _sizes),
            reverse=True,
        )[:25]
        lines.append("## containers that grew most since the previous census (by identity)")
        for delta, i, kind, n in grew:
            lines.append(f"{delta:>+10,} -> {n:>10,}  {kind:12} {_owner(found[i], skip)}")
        new = sorted(((n, i, kind) for i, (kind, n) in sized.items() if i not in _sizes))[-15:]
        lines.append("## the largest containers that are new since the previous census")
        for n, i, kind in reversed(new):
            lines.append(f"{n:>10,}  {kind:12} {_owner(found[i], skip)}")
    lines.append("## the largest containers now")
    for n, i, kind in sorted(((n, i, k) for i, (k, n) in sized.items()), reverse=True)[:25]:
        lines.append(f"{n:>10,}  {kind:12} {_owner(found[i], skip)}")
    _sizes.clear()
    _sizes.update(sized)
    found.clear()
    del objects
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")


def _dump(name: str) -> None:
    if CENSUS:
        _census(name)
        return
    if FROM_BASE and not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )
    traced = tracemalloc.get_traced_memory()[0]
    lines = [f"# {name}: traced {traced:,} B (current), RSS {_rss():,} B"]
    against = [("base", taken[0])] if taken else []
    if len(taken) > 1:
        against.append(("previous dump", taken[-1]))
    for label, old in against:
        for key, top in (("lineno", 25), ("traceback", 8)):
            lines.append(f"## by {key}, against {label}")
            for stat in snap.compare_to(old, key)[:top]:
                # a traceback runs from the oldest frame to the allocation: allocation first
                frames = list(reversed(stat.traceback))
                lines.append(f"{stat.size_diff:+12,} B {stat.count_diff:+9,}  {_where(frames[0])}")
                if key == "traceback":
                    lines.extend(f"{'':26}{_where(f)}" for f in frames[1:6])
    taken.append(snap)
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")
    snap.dump(str(out / f"{name}.snapshot"))


def _watch() -> None:
    while True:
        for want in sorted(out.glob("*.want")):
            _dump(want.stem)
            want.unlink()
        time.sleep(0.2)


threading.Thread(target=_watch, name="tracemalloc-dumps", daemon=True).start()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from streams.cli import main  # noqa: E402

sys.argv = ["trajstream", *sys.argv[2:]]
sys.exit(main())
