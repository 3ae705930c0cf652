"""``trajstream``: the one command line entry point.

    trajstream broker start|stop|status|run   the local single-node Kafka (no Docker needed)
    trajstream topics                         create the deployment's topics
    trajstream worker                         run a stream worker (add more to scale out)
    trajstream produce FILE...                publish JSON-lines agent events
    trajstream simulate                       drive simulated agent traffic
    trajstream standin                        run the Trinity stand-in server
    trajstream demo                           the whole loop on local parts, with a summary
    trajstream settings                       print the effective settings

Every command reads the settings (environment ``TRAJSTREAM_*``, ``--config FILE``); a bad
setting stops it at once with the setting's name. Exit codes: 0 ok, 1 failure, 2 usage or
configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from .errors import ConfigError, TrajstreamError
from .settings import Settings, load_settings

__all__ = ["main", "resolve_bootstrap"]

log = logging.getLogger("trajstream")


def resolve_bootstrap(settings: Settings) -> str:
    """The cluster to use: the configured one, else the running local broker."""
    if settings.bootstrap_servers:
        return settings.bootstrap_servers
    from .broker import status

    state = status(settings.cache_dir)
    if state is None:
        raise ConfigError(
            "no Kafka: set kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS or "
            "KAFKA_BOOTSTRAP_SERVERS], or start the local broker with `trajstream broker start`"
        )
    return state.bootstrap


def _ensure_topics(settings: Settings, bootstrap: str) -> list[str]:
    from .topics import Topics, create_topics

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    return asyncio.run(create_topics(bootstrap, topics.all(), settings.kafka.replication_factor))


# -- commands ------------------------------------------------------------------------------


def cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    from . import broker

    if args.action == "start":
        state = broker.start_detached(settings.cache_dir, port=args.port)
        if args.port is None and state.port != broker.DEFAULT_DETACHED_PORT:
            print(f"port {broker.DEFAULT_DETACHED_PORT} is busy; using {state.port}", file=sys.stderr)
        print(state.bootstrap)
        return 0
    if args.action == "stop":
        stopped = broker.stop_detached(settings.cache_dir)
        print("stopped" if stopped else "no local broker was running")
        return 0
    if args.action == "status":
        state = broker.status(settings.cache_dir)
        if state is None:
            print("not running")
            return 1
        print(f"running: {state.bootstrap} (pid {state.pid}, Kafka {state.kafka_version})")
        return 0
    # run: in the foreground until interrupted
    with broker.LocalBroker(settings.cache_dir, port=args.port or 0) as b:
        print(b.start(), flush=True)
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
    import faust

    from .app import Pipeline

    bootstrap = resolve_bootstrap(settings)
    _ensure_topics(settings, bootstrap)
    (settings.data_dir / settings.app_id).mkdir(parents=True, exist_ok=True)
    pipeline = Pipeline(settings, bootstrap=bootstrap)
    worker = faust.Worker(
        pipeline.app,
        loglevel=settings.log_level,
        quiet=True,
        redirect_stdouts=False,
        loop=_event_loop(),
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
    from .produce import read_events
    from .sdk import TrajstreamProducer

    events: list[Any] = []
    bad = 0
    for path in args.files:
        if not path.is_file():
            raise ConfigError(f"input file {path} does not exist")
        parsed = read_events(path)
        for err in parsed.errors:
            print(f"{path}:{err}", file=sys.stderr)
        bad += len(parsed.errors)
        events.extend(parsed.events)
    if bad and not args.skip_invalid:
        print(f"{bad} invalid line(s); nothing published (use --skip-invalid to publish the "
              "valid ones)", file=sys.stderr)
        return 1
    bootstrap = resolve_bootstrap(settings)
    _ensure_topics(settings, bootstrap)

    async def publish() -> None:
        async with TrajstreamProducer(
            bootstrap,
            topic_prefix=settings.kafka.topic_prefix,
            partitions=settings.kafka.partitions,
        ) as producer:
            await producer.publish_many(events)

    asyncio.run(publish())
    print(f"published {len(events)} event(s)" + (f", skipped {bad} invalid" if bad else ""))
    return 1 if bad and not events else 0


def cmd_simulate(args: argparse.Namespace, settings: Settings) -> int:
    import random

    from rich.progress import Progress

    from .sdk import TrajstreamProducer
    from .traffic import AGENTS, simulate_call
    from .trinity import TrinityClient

    bootstrap = resolve_bootstrap(settings)
    _ensure_topics(settings, bootstrap)
    rng = random.Random(args.seed)
    agents = list(AGENTS)

    async def drive() -> None:
        async with TrajstreamProducer(
            bootstrap, topic_prefix=settings.kafka.topic_prefix, partitions=settings.kafka.partitions
        ) as producer, TrinityClient(settings.trinity.url) as trinity:
            with Progress() as progress:
                task = progress.add_task("agent calls", total=args.calls)
                for i in range(args.calls):
                    await simulate_call(
                        producer, trinity, rng,
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


def cmd_standin(args: argparse.Namespace, settings: Settings) -> int:
    from .standin import StandIn

    StandIn().run(args.host, args.port)
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from .demo import run_demo

    return run_demo(settings, calls=args.calls, agents=args.agents)


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

    p = sub.add_parser("broker", help="the local single-node Kafka broker (fetched with Maven)")
    p.add_argument("action", choices=["start", "stop", "status", "run"])
    p.add_argument("--port", type=int, default=None, help="listener port (start: 9092 if free)")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("topics", help="create the deployment's topics")
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("worker", help="run a stream worker; start more to scale out")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("produce", help="publish JSON-lines files of agent events")
    p.add_argument("files", type=Path, nargs="+", metavar="FILE")
    p.add_argument("--skip-invalid", action="store_true",
                   help="publish the valid lines of a file that has invalid ones")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("simulate", help="drive simulated agent traffic (LLM steps served by "
                       "trinity.url's chat endpoint)")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rate", type=float, default=0.0, help="calls per second (0: as fast as possible)")
    p.add_argument("--marked", type=float, default=0.15, help="fraction of explicitly marked calls")
    p.add_argument("--seed", type=int, default=None)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("standin", help="run the Trinity stand-in server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8010)
    p.set_defaults(func=cmd_standin)

    p = sub.add_parser("demo", help="run the whole loop locally and print a summary")
    p.add_argument("--calls", type=int, default=120, help="agent calls to simulate")
    p.add_argument("--agents", type=int, default=3, help="simulated agents")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("settings", help="print the effective settings as JSON")
    p.set_defaults(func=cmd_settings)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
