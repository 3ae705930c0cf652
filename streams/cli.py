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

May import: anything in the package (the devtools lazily, per subcommand).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError, TrajstreamError
from .settings import Settings, load_settings

__all__ = ["main", "resolve_bootstrap"]

log = logging.getLogger("trajstream")


def resolve_bootstrap(settings: Settings, *, check: bool = True) -> str:
    """The cluster to use: the configured one, else the running local broker.

    ``check`` connects and authenticates once first, so that a wrong password, an untrusted
    certificate or an unreachable cluster stops the command at once with one line naming the
    setting (instead of a client retrying in its logs).
    """
    bootstrap = _bootstrap(settings)
    if check:
        from .io.security import check_kafka

        asyncio.run(check_kafka(bootstrap, settings.kafka.security))
    return bootstrap


def _bootstrap(settings: Settings) -> str:
    if settings.bootstrap_servers:
        return settings.bootstrap_servers
    from .devtools.broker import status

    state = status(settings.cache_dir)
    if state is None:
        raise ConfigError(
            "no Kafka: set kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS or "
            "KAFKA_BOOTSTRAP_SERVERS], or start the local broker with `trajstream broker start`"
        )
    return state.bootstrap_servers


def _ensure_topics(settings: Settings, bootstrap: str) -> list[str]:
    from .io.kafka import create_topics
    from .topics import Topics

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    return asyncio.run(
        create_topics(
            bootstrap,
            topics.all(),
            settings.kafka.replication_factor,
            security=settings.kafka.security,
            configs=topics.configs(),
            min_insync_replicas=settings.kafka.min_insync,
        )
    )


def _registry(settings: Settings, writes: list[str] | None = None) -> Any:
    """With ``kafka.schema_registry`` set: check and register the subjects of the topics this
    command writes, and let it read Confluent's wire format (:mod:`streams.io.registry`)."""
    from .io.registry import connect
    from .topics import Topics

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    return connect(settings.kafka.schema_registry, topics=topics, writes=writes or [], install=True)


# -- commands ------------------------------------------------------------------------------


def cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    from .devtools import broker

    if args.sasl_ssl and args.action != "run":
        raise ConfigError("--sasl-ssl is for `trajstream broker run` (a foreground broker)")
    if args.brokers < 1:
        raise ConfigError(f"--brokers must be at least 1, not {args.brokers}")
    if args.sasl_ssl and args.brokers > 1:
        raise ConfigError("--sasl-ssl runs one broker: leave out --brokers")
    if args.action == "start":
        state = broker.start_detached(settings.cache_dir, port=args.port, brokers=args.brokers)
        if args.port is None and state.port != broker.DEFAULT_DETACHED_PORT:
            print(
                f"port {broker.DEFAULT_DETACHED_PORT} is busy; using {state.port}", file=sys.stderr
            )
        if len(state.nodes) != args.brokers:
            print(
                f"a local broker of {len(state.nodes)} node(s) is running already; stop it "
                f"first for one of {args.brokers}",
                file=sys.stderr,
            )
        print(state.bootstrap_servers)
        return 0
    if args.action == "stop":
        stopped = broker.stop_detached(settings.cache_dir)
        print("stopped" if stopped else "no local broker was running")
        return 0
    if args.action == "status":
        running = broker.status(settings.cache_dir)
        if running is None:
            print("not running")
            return 1
        pids = ", ".join(str(n.pid) for n in running.nodes)
        print(f"running: {running.bootstrap_servers} (pid {pids}, Kafka {running.kafka_version})")
        return 0
    # run: in the foreground until interrupted
    if args.brokers > 1:
        with broker.LocalCluster(settings.cache_dir, brokers=args.brokers) as cluster:
            print(cluster.bootstrap_servers, flush=True)
            try:
                while True:
                    asyncio.run(asyncio.sleep(3600))
            except KeyboardInterrupt:
                pass
        return 0
    with broker.LocalBroker(settings.cache_dir, port=args.port or 0, sasl_ssl=args.sasl_ssl) as b:
        print(b.start(), flush=True)
        if args.sasl_ssl:
            assert b.data_dir is not None
            secret = b.data_dir / "tls" / "sasl-password"
            print(
                "# SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512):\n"
                f"TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS={b.sasl_ssl_bootstrap_servers}\n"
                "TRAJSTREAM_KAFKA__SECURITY__PROTOCOL=SASL_SSL\n"
                "TRAJSTREAM_KAFKA__SECURITY__MECHANISM=SCRAM-SHA-512\n"
                f"TRAJSTREAM_KAFKA__SECURITY__USERNAME={b.sasl_username}\n"
                f'TRAJSTREAM_KAFKA__SECURITY__PASSWORD="$(cat {secret})"\n'
                f"TRAJSTREAM_KAFKA__SECURITY__SSL_CAFILE={b.ca_file}",
                flush=True,
            )
        try:
            while True:
                asyncio.run(asyncio.sleep(3600))
        except KeyboardInterrupt:
            pass
    return 0


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    created = _ensure_topics(settings, resolve_bootstrap(settings))
    print("created: " + (", ".join(created) if created else "nothing (all exist)"))
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:

    from .io.kafka import create_topics, wait_until_ready
    from .runtime.live import Pipeline
    from .runtime.worker import BoundedWorker, install_log_limits, install_metadata_backoff
    from .settings import check_faust_environment
    from .topics import Topics

    check_faust_environment(os.environ)
    bootstrap = resolve_bootstrap(settings)
    _ensure_topics(settings, bootstrap)
    (settings.data_dir / settings.app_id).mkdir(parents=True, exist_ok=True)
    topics_of = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    registered = _registry(settings, topics_of.worker_writes())  # refuses a bad subject here
    pipeline = Pipeline(  # binds observe.port (or fails here)
        settings, bootstrap=bootstrap, framing=registered.framing if registered else None
    )
    # Before faust starts: on a fresh cluster, or right after faust creates the changelog
    # topics, its clients log "topic not found" and "coordinator not available" errors while
    # they retry, and the first assignment skips the changelogs it cannot see yet.
    changelogs = pipeline.changelog_topics()
    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions).all()

    async def prepare() -> None:
        await create_topics(
            bootstrap,
            {name: n for name, (n, _) in changelogs.items()},
            settings.kafka.replication_factor,
            security=settings.kafka.security,
            configs={name: config for name, (_, config) in changelogs.items()},
            min_insync_replicas=settings.kafka.min_insync,
        )
        await wait_until_ready(
            bootstrap,
            [*topics, *changelogs],
            group_id=settings.app_id,
            security=settings.kafka.security,
        )

    loop = _event_loop()
    loop.run_until_complete(prepare())
    if pipeline.server is not None:  # serving from the start: /healthz answers during recovery
        url = loop.run_until_complete(pipeline.server.start())
        log.info("metrics and health on %s (/metrics /healthz /readyz)", url)
    install_metadata_backoff()
    install_log_limits()
    worker = BoundedWorker(
        pipeline.app,
        loglevel=settings.log_level,
        quiet=True,
        redirect_stdouts=False,
        loop=loop,
        stop_timeout_s=settings.stop_timeout_s,
    )
    worker.execute_from_commandline()  # exits the process when the worker stops
    return 0


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from .capture.produce import input_files, read_events
    from .capture.sdk import TrajstreamProducer

    events: list[Any] = []
    bad = 0
    for path in input_files(args.files):
        parsed = read_events(path)
        for err in parsed.errors:
            print(f"{path}:{err}", file=sys.stderr)
        bad += len(parsed.errors)
        events.extend(parsed.events)
    if bad and not args.skip_invalid:
        print(
            f"{bad} invalid line(s); nothing published (use --skip-invalid to publish the "
            "valid ones)",
            file=sys.stderr,
        )
        return 1
    bootstrap = resolve_bootstrap(settings)
    _ensure_topics(settings, bootstrap)

    async def publish() -> None:
        async with TrajstreamProducer(
            bootstrap,
            topic_prefix=settings.kafka.topic_prefix,
            partitions=settings.kafka.partitions,
            security=settings.kafka.security,
            schema_registry=settings.kafka.schema_registry,
        ) as producer:
            await producer.publish_many(events)

    asyncio.run(publish())
    print(f"published {len(events)} event(s)" + (f", skipped {bad} invalid" if bad else ""))
    return 1 if bad and not events else 0


def cmd_otlp(args: argparse.Namespace, settings: Settings) -> int:
    from .capture.otlp_http import run_otlp

    if args.host is not None or args.port is not None:
        settings.otlp = settings.otlp.model_copy(
            update={k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        )
    bootstrap = resolve_bootstrap(settings)
    _ensure_topics(settings, bootstrap)
    asyncio.run(run_otlp(settings, bootstrap, ready=lambda url: print(url, flush=True)))
    return 0


def cmd_simulate(args: argparse.Namespace, settings: Settings) -> int:
    import random

    from rich.progress import Progress

    from .capture.sdk import TrajstreamProducer
    from .devtools.traffic import AGENTS, simulate_call
    from .io.trinity import TrinityClient

    bootstrap = resolve_bootstrap(settings)
    _ensure_topics(settings, bootstrap)
    rng = random.Random(args.seed)
    agents = list(AGENTS)

    async def drive() -> None:
        async with (
            TrajstreamProducer(
                bootstrap,
                topic_prefix=settings.kafka.topic_prefix,
                partitions=settings.kafka.partitions,
                security=settings.kafka.security,
                schema_registry=settings.kafka.schema_registry,
            ) as producer,
            TrinityClient.from_settings(settings.trinity) as trinity,
        ):
            with Progress() as progress:
                task = progress.add_task("agent calls", total=args.calls)
                for i in range(args.calls):
                    await simulate_call(
                        producer,
                        trinity,
                        rng,
                        agent=agents[i % len(agents)],
                        mark=rng.random() < args.marked,
                        fail=rng.random() < 0.1,
                        rating=float(rng.randint(1, 5)) if rng.random() < 0.4 else None,
                    )
                    progress.advance(task)
                    if args.rate > 0:
                        await asyncio.sleep(1.0 / args.rate)

    asyncio.run(drive())
    print(f"simulated {args.calls} agent calls (chat served by {settings.trinity.url})")
    return 0


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from .observe.audit import audit_table, count_decisions

    bootstrap = resolve_bootstrap(settings)
    _registry(settings)  # reads Confluent's wire format with a schema registry
    counts = asyncio.run(count_decisions(settings, bootstrap))
    print(audit_table(counts))
    print(f"{sum(counts.values())} calls decided")
    return 0


def audit_table(counts: Mapping[tuple[str, str, str, str], int]) -> str:
    """Compatibility: :func:`streams.observe.audit.audit_table`."""
    from .observe.audit import audit_table as table

    return table(counts)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from .observe.status import collect, render

    bootstrap = resolve_bootstrap(settings)
    _registry(settings)  # reads Confluent's wire format with a schema registry
    if args.web:
        from .observe.pages import serve_pages

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
    from .io.operations import resume_commits
    from .topics import Topics

    bootstrap = resolve_bootstrap(settings)
    _registry(settings, [Topics(settings.kafka.topic_prefix, settings.kafka.partitions).ledger])
    asyncio.run(resume_commits(settings, bootstrap, args.agent, args.model, args.by, args.reason))
    print(
        f"asked the ledger to resume commits held for agent {args.agent or 'any'}, "
        f"model {args.model or 'any'}"
    )
    return 0


def cmd_standin(args: argparse.Namespace, settings: Settings) -> int:
    from .devtools.standin import StandIn

    StandIn().run(args.host, args.port)
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from .devtools.demo import run_demo

    return run_demo(settings, calls=args.calls, agents=args.agents)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from .models import utcnow
    from .runtime.replay import ReplayOptions, run_replay

    prefix = settings.kafka.topic_prefix
    options = ReplayOptions.from_args(args, prefix, utcnow())
    options.validate()
    bootstrap = resolve_bootstrap(settings)
    from .topics import Topics

    topics = Topics(prefix, settings.kafka.partitions)
    # reads either encoding; writes <p>.verdicts (a judge asked, also on a dry run) and, to
    # Trinity, <p>.replayed in the wire format
    _registry(settings, [topics.verdicts, *([topics.replayed] if "trinity" in options.to else [])])
    result = asyncio.run(run_replay(settings, bootstrap, options))
    return 1 if result.rejected else 0


_REPLAY_EXAMPLES = """\
examples:
  trajstream replay --since 2h                                  dry run: what would be selected
  trajstream replay --since 2026-01-31T00:00Z --until 2026-02-01T00:00Z \\
      --strategy "sampling:1" --reward mypkg.rewards:strict --to trinity --commit-every 100
  trajstream replay --since 7d --to files --out datasets/week --min-reward 0.8 --redact
  trajstream replay --since 1d --reward streams.rewards:success \\
      --compare-reward streams.rewards:user_rating                A/B of two reward functions
  trajstream replay --offsets agent-events:0:1000-2000 --offsets user-feedback:0:0-

Without --to (or with --dry-run) nothing is sent or written. Acknowledged feedback is recorded
on <prefix>.replayed: re-running a replay skips it, and says so.
"""


def cmd_gateway(args: argparse.Namespace, settings: Settings) -> int:
    from .capture.gateway import build_gateway, run_gateway

    updates = {
        k: v
        for k, v in (
            ("host", args.host),
            ("port", args.port),
            ("mode", args.mode),
            ("production_url", args.production_url),
        )
        if v is not None
    }
    if updates:
        gateway = settings.gateway.model_validate({**settings.gateway.model_dump(), **updates})
        settings = settings.model_copy(update={"gateway": gateway})
    bootstrap = resolve_bootstrap(settings)
    settings = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"bootstrap_servers": bootstrap})}
    )
    build_gateway(settings)  # bad settings fail here, before anything listens
    from .topics import Topics

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    # with a schema registry: its subjects checked here; its producer writes the wire format
    _registry(settings, [topics.agent_events, topics.user_feedback])

    def ready(url: str) -> None:
        print(
            f"trajstream gateway on {url} ({settings.gateway.mode} mode); agents use "
            f"base_url={url}/calls/<call_id>/v1",
            flush=True,
        )

    loop = _event_loop()
    try:
        loop.run_until_complete(run_gateway(settings, ready=ready))
    finally:
        loop.close()
    return 0


def cmd_settings(args: argparse.Namespace, settings: Settings) -> int:
    print(json.dumps(settings.model_dump(mode="json"), indent=2))
    return 0


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
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "replay",
        help="re-score a range of history under a strategy and reward: dry run, to Trinity, or "
        "to dataset files",
        description="Replay the input topics over a time range (or explicit offsets) through "
        "the pipeline's selection, assembly and reward stages, with a strategy and reward "
        "function that may differ from the live ones. Reads without a consumer group: the live "
        "workers' offsets and state are never touched.",
        epilog=_REPLAY_EXAMPLES,
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
