"""The pipeline's commands: ``trajstream topics``, ``worker``, ``replay`` and ``settings``
(:mod:`streams.runtime`).

May import: anything in the package but :mod:`streams.cli` (the runtime lazily, per command).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from typing import Any

from ..cli_support import ensure_topics, event_loop, resolve_bootstrap, subjects
from ..settings import Settings

__all__ = [
    "REPLAY_EXAMPLES",
    "add_replay",
    "add_settings",
    "add_topics",
    "add_worker",
    "check_worker_settings",
    "cmd_replay",
    "cmd_settings",
    "cmd_topics",
    "cmd_worker",
]

log = logging.getLogger("trajstream")


def add_topics(sub: Any) -> None:
    p = sub.add_parser("topics", help="create the deployment's topics")
    p.set_defaults(func=cmd_topics)


def add_worker(sub: Any) -> None:
    p = sub.add_parser("worker", help="run a stream worker; start more to scale out")
    p.set_defaults(func=cmd_worker, check=check_worker_settings)


def check_worker_settings(settings: Settings) -> None:
    """The worker's start-up checks that touch nothing outside (streams.cli.startup): Faust's
    own environment variables, which would override the settings unseen."""
    import os

    from ..settings import check_faust_environment

    check_faust_environment(os.environ)


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    created = ensure_topics(settings, resolve_bootstrap(settings))
    print("created: " + (", ".join(created) if created else "nothing (all exist)"))
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:

    from ..io.kafka import create_topics, wait_until_ready
    from ..runtime.live.app import Pipeline
    from ..runtime.live.worker import (
        BoundedWorker,
        exit_on_stall,
        install_allocator_limits,
        install_log_limits,
    )
    from ..settings import check_faust_environment
    from ..topics import Topics

    check_faust_environment(os.environ)
    bootstrap = resolve_bootstrap(settings)
    ensure_topics(settings, bootstrap)
    (settings.data_dir / settings.app_id).mkdir(parents=True, exist_ok=True)
    topics_of = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    registered = subjects(settings, topics_of.worker_writes())  # refuses a bad subject here
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

    loop = event_loop()
    loop.run_until_complete(prepare())
    if pipeline.server is not None:  # serving from the start: /healthz answers during recovery
        url = loop.run_until_complete(pipeline.server.start())
        log.info("metrics and health on %s (/metrics /healthz /readyz)", url)
    install_log_limits()
    install_allocator_limits()
    worker = BoundedWorker(
        pipeline.app,
        loglevel=settings.log_level,
        quiet=True,
        redirect_stdouts=False,
        loop=loop,
        stop_timeout_s=settings.stop_timeout_s,
    )
    if settings.observe.exit_after_stall_s:  # a task of its own: Faust's timers wait for recovery
        loop.create_task(
            exit_on_stall(
                pipeline.metrics.stall_reason,
                settings.observe.exit_after_stall_s,
                worker.stop_stalled,
                every_s=min(5.0, settings.observe.lag_interval_s),
            )
        )
    worker.execute_from_commandline()  # exits the process when the worker stops
    return 0


def add_replay(sub: Any) -> None:
    from ..runtime.replay_options import add_replay_arguments

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
    add_replay_arguments(p)  # one list: the fields of ReplayOptions
    p.set_defaults(func=cmd_replay)


def add_settings(sub: Any) -> None:
    p = sub.add_parser("settings", help="print the effective settings as JSON")
    p.set_defaults(func=cmd_settings)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from ..models import utcnow
    from ..runtime.replay import ReplayOptions, run_replay

    prefix = settings.kafka.topic_prefix
    options = ReplayOptions.from_args(args, prefix, utcnow())
    options.validate()
    bootstrap = resolve_bootstrap(settings)
    from ..topics import Topics

    topics = Topics(prefix, settings.kafka.partitions)
    # reads either encoding; writes <p>.verdicts (a judge asked, also on a dry run) and, to
    # Trinity, <p>.replayed in the wire format
    subjects(settings, [topics.verdicts, *([topics.replayed] if "trinity" in options.to else [])])
    result = asyncio.run(run_replay(settings, bootstrap, options))
    return 1 if result.rejected else 0


REPLAY_EXAMPLES = """\
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


def cmd_settings(args: argparse.Namespace, settings: Settings) -> int:
    print(json.dumps(settings.model_dump(mode="json"), indent=2))
    return 0
