"""``trajstream``: the one command line entry point.

    trajstream broker start|stop|status|run   the local Kafka, one node or --brokers N (no Docker)
    trajstream topics                         create the deployment's topics
    trajstream worker                         run a stream worker (add more to scale out)
    trajstream produce FILE...                publish JSON-lines agent events
    trajstream otlp                           receive OpenTelemetry GenAI spans (OTLP/HTTP)
    trajstream simulate                       drive simulated agent traffic
    trajstream audit                          why calls were or were not selected
    trajstream status [--json] [--web]        workers, lag, commits, dead letters, hints
    trajstream standin                        run the Trinity stand-in server
    trajstream demo                           the whole loop on local parts, with a summary
    trajstream replay                         re-score a range of history: dry run, Trinity, files
    trajstream settings                       print the effective settings

Every command reads the settings (environment ``TRAJSTREAM_*``, ``--config FILE``); a bad
setting stops it at once with the setting's name. Exit codes: 0 ok, 1 failure, 2 usage or
configuration error.

This module builds the parser (replay's options from the fields of ``ReplayOptions``, ``compare``
and ``routing`` from :mod:`streams.policy_cli`) and dispatches; the command bodies are in
:mod:`streams.commands`, by area, and re-exported here.

May import: anything in the package (the devtools lazily, per subcommand).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .cli_support import resolve_bootstrap
from .commands.capture import cmd_gateway, cmd_otlp, cmd_produce
from .commands.local import cmd_broker, cmd_demo, cmd_simulate, cmd_standin
from .commands.operate import audit_table, cmd_audit, cmd_commits_resume, cmd_status
from .commands.pipeline import (
    REPLAY_EXAMPLES,
    cmd_replay,
    cmd_settings,
    cmd_topics,
    cmd_worker,
)
from .errors import ConfigError, TrajstreamError
from .settings import load_settings

__all__ = [
    "audit_table",
    "build_parser",
    "cmd_audit",
    "cmd_broker",
    "cmd_commits_resume",
    "cmd_demo",
    "cmd_gateway",
    "cmd_otlp",
    "cmd_produce",
    "cmd_replay",
    "cmd_settings",
    "cmd_simulate",
    "cmd_standin",
    "cmd_status",
    "cmd_topics",
    "cmd_worker",
    "main",
    "resolve_bootstrap",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trajstream",
        description="Turn production LLM-agent traffic on Kafka into Trinity-RFT training.",
    )
    parser.add_argument("--config", type=Path, help="settings file (.toml or .yaml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("broker", help="the local Kafka broker or cluster (fetched with Maven)")
    p.add_argument("action", choices=["start", "stop", "status", "run"])
    p.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="start/run: a cluster of N brokers (a KRaft controller quorum of N; 3 for "
        "replication factor 3 with min.insync.replicas 2)",
    )
    p.add_argument("--port", type=int, default=None, help="listener port (start: 9092 if free)")
    p.add_argument(
        "--sasl-ssl",
        action="store_true",
        help="run: also listen with SASL_SSL (a CA made at start, PLAIN and SCRAM users) and "
        "print the settings that connect to it",
    )
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser(
        "gateway",
        help="the OpenAI-compatible gateway: route selected calls to Trinity, record every step",
        description="Serve OpenAI's chat completions API in front of Trinity and a production "
        "model. Agents set their client's base_url to http://HOST:PORT/calls/<call_id>/v1.",
    )
    p.add_argument("--host", default=None, help="listen address (gateway.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (gateway.port)")
    p.add_argument("--mode", choices=["route", "shadow"], default=None, help="gateway.mode")
    p.add_argument("--production-url", default=None, help="gateway.production_url")
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("topics", help="create the deployment's topics")
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("worker", help="run a stream worker; start more to scale out")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("produce", help="publish JSON-lines files of agent events")
    p.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="a JSON-lines file, or a directory: its *.jsonl files, in name order",
    )
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="publish the valid lines of a file that has invalid ones",
    )
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser(
        "otlp",
        help="receive OpenTelemetry GenAI spans on POST /v1/traces (OTLP/HTTP) as agent events",
    )
    p.add_argument("--host", default=None, help="listen address (default: otlp.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: otlp.port, 4318)")
    p.set_defaults(func=cmd_otlp)

    p = sub.add_parser(
        "simulate",
        help="drive simulated agent traffic (LLM steps served by trinity.url's chat endpoint)",
    )
    p.add_argument("--calls", type=int, default=100)
    p.add_argument(
        "--rate", type=float, default=0.0, help="calls per second (0: as fast as possible)"
    )
    p.add_argument("--marked", type=float, default=0.15, help="fraction of explicitly marked calls")
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("audit", help="count the selection decisions by agent, strategy and reason")
    p.set_defaults(func=cmd_audit)

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

    from .policy_cli import add_commands as add_policy_commands

    add_policy_commands(sub)  # compare, routing

    p = sub.add_parser("standin", help="run the Trinity stand-in server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8010)
    p.set_defaults(func=cmd_standin)

    p = sub.add_parser("demo", help="run the whole loop locally and print a summary")
    p.add_argument("--calls", type=int, default=120, help="agent calls to simulate")
    p.add_argument("--agents", type=int, default=3, help="simulated agents")
    p.add_argument(
        "--rollout",
        action="store_true",
        help="gateway.rollout on, production scripted to fail more than the policy: the "
        "comparison and the policy's promotion (try --agents 1 --calls 400)",
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "replay",
        help="re-score a range of history under a strategy and reward: dry run, to Trinity, or "
        "to dataset files",
        description="Replay the input topics over a time range (or explicit offsets) through "
        "the pipeline's selection, assembly and reward stages, with a strategy and reward "
        "function that may differ from the live ones. Reads without a consumer group: the live "
        "workers' offsets and state are never touched.",
        epilog=REPLAY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .runtime.replay_options import add_replay_arguments

    add_replay_arguments(p)  # one list: the fields of ReplayOptions
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("settings", help="print the effective settings as JSON")
    p.set_defaults(func=cmd_settings)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "aiokafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        settings = load_settings(args.config)
        return int(args.func(args, settings))
    except ConfigError as exc:
        print(f"trajstream: {exc}", file=sys.stderr)
        return 2
    except TrajstreamError as exc:
        print(f"trajstream: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
