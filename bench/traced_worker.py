"""A worker under tracemalloc, for ``bench/run.py --trace-memory DIR``: where memory goes.

    python bench/traced_worker.py DIR worker [trajstream worker options]

Starts tracing (8 frames) before anything is imported, then runs the trajstream CLI. A thread
watches DIR: for each file ``<name>.want`` the bench creates, it takes a snapshot and writes
``<name>.txt``: the top allocators (by line and by traceback) against the first snapshot it
took (``base.want``, the bench asks for it after warm-up), so the lines say what grew since.
Tracing costs CPU (the worker is slower under it): use it to find allocators, not to time.
"""

from __future__ import annotations

import sys
import threading
import time
import tracemalloc
from pathlib import Path

tracemalloc.start(8)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
base: list[tracemalloc.Snapshot] = []
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


def _dump(name: str) -> None:
    snap = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )
    if not base:
        base.append(snap)
    rss = next(
        int(x.split()[1])
        for x in Path("/proc/self/status").read_text().splitlines()
        if x.startswith("VmRSS:")
    )
    traced = tracemalloc.get_traced_memory()[0]
    lines = [f"# {name}: traced {traced:,} B (current), RSS {rss * 1024:,} B"]
    for key, top in (("lineno", 25), ("traceback", 8)):
        lines.append(f"## by {key}, against base")
        for stat in snap.compare_to(base[0], key)[:top]:
            # a traceback runs from the oldest frame to the allocation: print the allocation first
            frames = list(reversed(stat.traceback))
            lines.append(f"{stat.size_diff:+12,} B {stat.count_diff:+9,}  {_where(frames[0])}")
            if key == "traceback":
                lines.extend(f"{'':26}{_where(f)}" for f in frames[1:6])
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")


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
