"""The operators' commands: ``trajstream audit``, ``status`` and ``commits resume``
(:mod:`streams.observe`, :mod:`streams.io.operations`).

May import: anything in the package but :mod:`streams.cli` (lazily, per command).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping
from typing import Any

from ..cli_support import resolve_bootstrap, subjects
from ..settings import Settings

__all__ = [
    "add_audit",
    "add_commits",
    "add_status",
    "audit_table",
    "cmd_audit",
    "cmd_commits_resume",
    "cmd_status",
]


def add_audit(sub: Any) -> None:
    p = sub.add_parser("audit", help="count the selection decisions by agent, strategy and reason")
    p.set_defaults(func=cmd_audit)


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


def add_status(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="one screen: workers and partitions, lag, open calls, commits, dead letters, "
        "drift alerts, and what needs attention",
        description="Read the deployment's topics and consumer group (nothing is written, no "
        "group is joined) and show what needs attention. Exit code 1 when a hint is an error "
        "(no workers, or no commit for more than 2 commit intervals while rewards wait).",
    )
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.add_argument(
        "--gap",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="read offsets twice this far apart to tell a growing lag (default 2; 0: once)",
    )
    p.add_argument(
        "--web",
        action="store_true",
        help="serve the status page (recent calls, trajectories, rewards, reward trend) instead",
    )
    p.add_argument("--host", default="127.0.0.1", help="--web: address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9641, help="--web: port (default 9641)")
    p.set_defaults(func=cmd_status)


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


def add_commits(sub: Any) -> None:
    p = sub.add_parser("commits", help="act on the ledger's commits (operators)")
    commits = p.add_subparsers(dest="commits_command", required=True, metavar="ACTION")
    q = commits.add_parser(
        "resume",
        help="resume commits held on a reward drop (commit.hold_on_drift); publishes a "
        "CommitResume to the ledger topic",
    )
    q.add_argument("--agent", default=None, help="only the holds of this agent (default: all)")
    q.add_argument("--model", default=None, help="only the holds of this model (default: all)")
    q.add_argument("--reason", default="", help="recorded with the request")
    q.add_argument("--by", default="", help="who asks, recorded with the request")
    q.set_defaults(func=cmd_commits_resume)


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
