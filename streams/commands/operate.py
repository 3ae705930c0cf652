"""The operators' commands: ``trajstream audit``, ``status`` and ``commits resume``
(:mod:`streams.observe`, :mod:`streams.io.operations`).

May import: anything in the package but :mod:`streams.cli` (lazily, per command).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping

from ..cli_support import resolve_bootstrap, subjects
from ..settings import Settings

__all__ = [
    "audit_table",
    "cmd_audit",
    "cmd_commits_resume",
    "cmd_status",
]


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from ..observe.audit import audit_table, count_decisions

    bootstrap = resolve_bootstrap(settings)
    subjects(settings)  # reads Confluent's wire format with a schema registry
    counts = asyncio.run(count_decisions(settings, bootstrap))
    print(audit_table(counts))
    print(f"{sum(counts.values())} calls decided")
    return 0


def audit_table(counts: Mapping[tuple[str, str, str, str], int]) -> str:
    """Compatibility: :func:`streams.observe.audit.audit_table`."""
    from ..observe.audit import audit_table as table

    return table(counts)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from ..observe.status import collect, render

    bootstrap = resolve_bootstrap(settings)
    subjects(settings)  # reads Confluent's wire format with a schema registry
    if args.web:
        from ..observe.pages import serve_pages

        serve_pages(settings, bootstrap, args.host, args.port)
        return 0
    status = asyncio.run(collect(settings, bootstrap, sample_gap_s=args.gap))
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        from rich.console import Console

        render(status, Console())
    return 1 if any(h.level == "error" for h in status.hints) else 0


def cmd_commits_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Publish a CommitResume to the ledger topic: the ledger ends the holds it names.

    An operator action: whoever may write the ledger topic may resume commits (grant it to the
    workers' principal and to operators only)."""
    from ..io.operations import resume_commits
    from ..topics import Topics

    bootstrap = resolve_bootstrap(settings)
    subjects(settings, [Topics(settings.kafka.topic_prefix, settings.kafka.partitions).ledger])
    asyncio.run(resume_commits(settings, bootstrap, args.agent, args.model, args.by, args.reason))
    print(
        f"asked the ledger to resume commits held for agent {args.agent or 'any'}, "
        f"model {args.model or 'any'}"
    )
    return 0
