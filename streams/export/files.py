"""Writing an export: files under a temporary name in the target directory, renamed into place
only when all are complete, ``manifest.json`` last (:func:`write_export`), and the check that
the target is writable before any work (:func:`check_writable`).

May import: the standard library, the top-level modules.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ExportError
from .formats import Row, canonical

__all__ = [
    "ExportFile",
    "check_writable",
    "write_export",
]


def check_writable(out: Path) -> Path:
    """Create ``out`` if needed and prove a file can be written there; else :class:`ConfigError`
    naming the path. Called before any work, so a bad path costs nothing."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".trajstream-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write the export to {out}: {exc.strerror or exc}") from None
    return out


@dataclass
class ExportFile:
    """One file of an export: its rows, a trace per row and what dedupe removed."""

    name: str
    format: str
    rows: list[Row]
    traces: list[Row]
    duplicates_removed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def write_export(
    out: Path, files: Sequence[ExportFile], manifest: Mapping[str, Any]
) -> dict[str, Any]:
    """Write every file and ``manifest.json`` into ``out``, all or nothing.

    Each file is written to a temporary name beside its target; only when all are complete are
    they renamed into place (``os.replace``), the manifest last. Returns the manifest written,
    with each file's rows, duplicates removed, sha256 and trace.
    """
    temps: list[tuple[Path, Path]] = []
    full = dict(manifest)
    listing: dict[str, Any] = {}
    try:
        for f in files:
            tmp, digest = _write_temp(out, f.name, (canonical(r) + "\n" for r in f.rows))
            temps.append((tmp, out / f.name))
            listing[f.name] = {
                "format": f.format,
                "rows": len(f.rows),
                "duplicates_removed": f.duplicates_removed,
                "sha256": digest,
                **f.extra,
                "trace": f.traces,
            }
        full["files"] = listing
        text = json.dumps(full, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
        tmp, _ = _write_temp(out, "manifest.json", [text])
        temps.append((tmp, out / "manifest.json"))
        for tmp, target in temps:
            os.replace(tmp, target)
    except OSError as exc:
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise ExportError(f"cannot write the export to {out}: {exc.strerror or exc}") from exc
    return full


def _write_temp(out: Path, name: str, lines: Iterable[str]) -> tuple[Path, str]:
    fd, path = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
    digest = hashlib.sha256()
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a dataset is an ordinary file
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            for line in lines:
                fh.write(line)
                digest.update(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return Path(path), digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
