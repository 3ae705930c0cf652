"""The replay runner: a bounded range of history through the live worker's own core.

``trajstream replay`` reads a bounded range of ``<p>.agent-events`` and ``<p>.user-feedback``
(a time range, or explicit offsets) and runs it through the same stages as the live workers
(:class:`ReplayRunner`: :mod:`streams.core.assemble` and :mod:`streams.core.reward_join` over
in-memory stores), with a strategy and reward function of your choice. Only the clock differs
(:mod:`streams.core.clock`: record time instead of ticks). The result goes nowhere (a dry run),
to Trinity (feedback with the one retry policy of :func:`streams.io.trinity.retrying`, then
commits by the live ledger's stage and rule over a state in memory,
:class:`streams.core.backfill.Backfill`, and the protocol of :mod:`streams.core.commits`:
write-ahead, resolved after a crash, never empty), or to dataset files
(:mod:`streams.export.build`).

:func:`run_replay` is the driver: a plain consumer with manually assigned partitions and no
consumer group (:mod:`streams.io.kafka`; it can neither move the live workers' offsets nor touch
their tables), the Trinity client, the ``<p>.replayed`` ledger (:mod:`streams.core.backfill`)
and the files.

The LLM judge: a replay never asks again for a call with a verdict on ``<p>.verdicts`` (read
whole before the range, the last record of a call kept: the one compaction keeps, and the one
the live reward stage made last); a trajectory that needs a verdict and has none gets one as
``reward.judge.replay_missing`` says: ``ask`` (the default) asks the judge after the range is
read, with the live judge stage's retries, and records the verdicts on ``<p>.verdicts`` (so the
next replay and the workers reuse them; also on a dry run), ``dead_letter`` makes it a ``judge``
dead letter.

Idempotence: every feedback Trinity acknowledged is recorded on ``<p>.replayed``. A replay first
reads it and skips what was acknowledged under the same replay id, which is a hash of the
source prefix, the strategy and the reward function with its version: re-running a replay, or
replaying an overlapping range, rewards nothing twice.

May import: the core, :mod:`streams.io`, :mod:`streams.export`, the top-level modules, rich.
Not the devtools.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from ..codec import SchemaRegistry
from ..core.backfill import (
    Outcome,
    ack_key,
    backfill_config,
    commit_key,
    plan_feedback,
    read_ledger,
    replay_id,
    replayed_topic,
)
from ..core.rewards import build_rewarder
from ..core.select import build_strategy
from ..errors import BrokerError, ConfigError
from ..export.build import build_exports
from ..export.dataset import check_writable, write_export
from ..export.redact import Redactor
from ..io import kafka
from ..models import (
    utcnow,
)
from ..topics import Topics
from .config import judge_of, ledger_config_of, limits_of
from .replay_io import (
    Replayed,
    judge_missing,
    manifest,
    read_range,
    read_replayed,
    read_verdicts,
    resolve_range,
    send_to_trinity,
)
from .replay_options import OffsetRange, ReplayError, ReplayOptions, parse_offsets, parse_time
from .replay_report import Comparison, Distribution, ReplayResult, compare, print_summary
from .replay_runner import END_OF_TIME, VERDICTS_LOADED_AT, ReplayCore, ReplayRunner, SourceRecord

if TYPE_CHECKING:
    from rich.console import Console

    from ..io.trinity import TrinityClient
    from ..settings import Settings

__all__ = [
    "END_OF_TIME",
    "VERDICTS_LOADED_AT",
    "Comparison",
    "Distribution",
    "OffsetRange",
    "Outcome",
    "ReplayCore",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "ReplayRunner",
    "SourceRecord",
    "ack_key",
    "build_exports",
    "commit_key",
    "compare",
    "parse_offsets",
    "parse_time",
    "plan_feedback",
    "read_ledger",
    "replay_id",
    "replayed_topic",
    "run_replay",
]

log = logging.getLogger("trajstream.replay")


async def run_replay(
    settings: Settings,
    bootstrap: str,
    options: ReplayOptions,
    *,
    console: Console | None = None,
    progress_console: Console | None = None,
    trinity: Callable[[], TrinityClient] | None = None,
    codec: SchemaRegistry | None = None,
) -> ReplayResult:
    """Run one replay end to end and print its summary; see the module docstring."""
    from rich.console import Console

    options.validate()
    console = console or Console()
    progress_console = progress_console or Console(stderr=True)
    codec = codec or SchemaRegistry.default()
    prefix = settings.kafka.topic_prefix
    started = utcnow()

    strategy = build_strategy(
        options.strategy or settings.selection.strategy,
        rate=settings.selection.rate,
        mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
    )
    weights, gamma = settings.reward.weights, settings.reward.step_discount
    mixed = settings.reward.train_mixed
    rewarders = [
        build_rewarder(
            options.reward or settings.reward.function, weights, gamma, train_mixed=mixed
        )
    ]
    if options.compare_reward:
        rewarders.append(build_rewarder(options.compare_reward, weights, gamma, train_mixed=mixed))
    judge = judge_of(settings, rewarders)  # a judge reward without its settings fails here
    redactor = Redactor(options.redact_patterns, enabled=options.redact)  # files
    task_redactor = Redactor(options.redact_patterns, enabled=options.redact)  # Trinity task_id
    pacing = backfill_config(  # the workers' commit rule with replay's pacing
        ledger_config_of(settings),
        options.commit_every,
        options.commit_interval_s
        if options.commit_interval_s is not None
        else settings.commit.interval_s,
    )
    dry_run = options.dry_run or not options.to
    if options.out is not None and not dry_run:
        check_writable(options.out)  # before any work: a bad path costs nothing
    rid = replay_id(prefix, strategy.name, rewarders[0].name, rewarders[0].version)
    client_id = f"{settings.app_id}-replay-{rid}"
    lookback = timedelta(
        seconds=options.lookback_s
        if options.lookback_s is not None
        else settings.assembly.abandon_after_s
    )

    names = Topics(prefix, settings.kafka.partitions)
    try:
        topics = await kafka.topic_partitions(bootstrap, settings.kafka.security)
    except BrokerError as exc:
        raise ReplayError(str(exc)) from exc
    if names.agent_events not in topics:
        raise ConfigError(
            f"unknown topic {prefix}.agent-events: nothing to replay under "
            f"kafka.topic_prefix={prefix!r} [TRAJSTREAM_KAFKA__TOPIC_PREFIX]"
        )
    # no group: nothing is committed anywhere, and the live group never sees this consumer
    consumer = kafka.consumer(
        bootstrap, settings.kafka.security, group_id=None, client_id=client_id
    )
    await consumer.start()
    # let the consumer's background task start: stopping it before it ran raises
    # CancelledError out of aiokafka's stop() (no-group mode)
    await asyncio.sleep(0)
    replayed = Replayed()
    try:
        ranges, source = await resolve_range(consumer, topics, prefix, options, started, lookback)
        core = ReplayRunner(
            strategy,
            rewarders,
            limits=limits_of(settings),
            topics=names,
            feedback_grace=timedelta(seconds=settings.reward.feedback_grace_s),
            score_incomplete=settings.reward.score_incomplete,
            late_retention=timedelta(seconds=settings.assembly.late_retention_s),
            since=options.since,
            codec=codec,
            judge=judge,
        )
        result = ReplayResult(rid, core, source, dry_run=dry_run)
        if judge is not None:  # the verdicts first: no judge request for a call that has one
            core.load_verdicts(await read_verdicts(consumer, topics, names.verdicts))
        result.records = await read_range(consumer, ranges, core, progress_console)
        end_of_range = options.until or (None if options.offsets else started)
        core.finish(end_of_range)
        if core.judge_requests:  # calls with no stored verdict: ask, or dead letters
            await judge_missing(settings, bootstrap, core, progress_console, codec)
        if "trinity" in options.to:
            replayed = await read_replayed(consumer, topics, names.replayed, rid, codec)
            result.ledger = replayed.ledger
            result.acknowledged_before = len(replayed.acknowledged)
            result.uncommitted_before = len(replayed.uncommitted)
            result.plan = plan_feedback(
                (r for _, r in core.scored()), replayed.acknowledged, task_redactor
            )
    finally:
        await consumer.stop()

    if options.compare_reward:
        result.comparison = compare(core.outcomes, options.min_reward)
    if (
        result.plan is not None
        and not result.dry_run
        and (
            result.plan.send
            or result.uncommitted_before
            or (result.ledger is not None and result.ledger.pending_commit is not None)
        )
    ):
        sent = await send_to_trinity(
            settings,
            bootstrap,
            client_id,
            rid,
            result.plan,
            replayed,
            pacing,
            progress_console,
            trinity,
            codec,
        )
        result.sent, result.acked, result.commits = sent.sent, sent.acked, sent.commits
        result.rejected = sent.rejected
    if "files" in options.to:
        result.exports = build_exports(
            core.outcomes,
            min_reward=options.min_reward,
            dpo_margin=options.dpo_margin,
            redactor=redactor,
        )
        if not result.dry_run:
            assert options.out is not None
            result.manifest = write_export(
                options.out, result.exports, manifest(result, settings, options, redactor, codec)
            )
    if redactor.enabled:
        result.redactions = {
            "files": redactor.summary() if "files" in options.to else None,
            "trinity_task_ids": task_redactor.summary() if "trinity" in options.to else None,
        }
    print_summary(console, result, options)
    return result
