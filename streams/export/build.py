"""The export files of a replay: trajectories, SFT and DPO rows from its outcomes, redacted and
with exact duplicates removed (written by :func:`streams.export.dataset.write_export`).

May import: the top-level modules, the core, :mod:`streams.export`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.backfill import Outcome
from .dataset import (
    ExportFile,
    correction_pairs,
    correction_sft_rows,
    dedupe,
    preference_pairs,
    ranking_pairs,
    sft_row,
    trajectory_row,
)
from .redact import Redactor

__all__ = ["build_exports"]


def build_exports(
    outcomes: Sequence[Outcome],
    *,
    min_reward: float,
    dpo_margin: float,
    redactor: Redactor,
) -> list[ExportFile]:
    """The three export files of a replay's outcomes (primary reward function), redacted and
    with exact duplicates removed."""
    scored = [(o, r) for o in outcomes if (r := o.rewards[0]) is not None]
    scored.sort(key=lambda orr: (orr[0].trajectory.ended_at, orr[0].call_id))

    traj_rows = [redactor.redact_obj(trajectory_row(o.scored_trajectory(), r)) for o, r in scored]
    traj_traces = [{"call_id": o.call_id, "reward": r.reward} for o, r in scored]

    sft_rows, sft_traces = [], []
    below = empty = 0
    for o, r in scored:
        if r.reward < min_reward:
            below += 1
            continue
        row = sft_row(o.trajectory)
        if row is None:
            empty += 1
            continue
        sft_rows.append(redactor.redact_obj(row))
        sft_traces.append({"call_id": o.call_id, "reward": r.reward})
    corrected = [p for o, _ in scored for p in correction_sft_rows(o.trajectory, o.feedback)]
    sft_rows += [redactor.redact_obj(p.row) for p in corrected]
    sft_traces += [p.trace for p in corrected]

    pairs = [p for o, _ in scored for p in preference_pairs(o.trajectory, o.feedback)]
    preference = len(pairs)
    pairs += [p for o, _ in scored for p in correction_pairs(o.trajectory, o.feedback)]
    corrections = len(pairs) - preference
    pairs += ranking_pairs(((o.trajectory, r) for o, r in scored), dpo_margin)
    dpo_rows = [redactor.redact_obj(p.row) for p in pairs]
    dpo_traces = [p.trace for p in pairs]

    files = []
    for name, fmt, rows, traces, extra in (
        ("trajectories.jsonl", "trajstream-rewarded-trajectory", traj_rows, traj_traces, {}),
        (
            "sft.jsonl",
            "openai-chat-fine-tuning",
            sft_rows,
            sft_traces,
            {
                "min_reward": min_reward,
                "below_min_reward": below,
                "nothing_to_train_on": empty,
                "from_corrections": len(corrected),
            },
        ),
        (
            "dpo.jsonl",
            "openai-preference-fine-tuning",
            dpo_rows,
            dpo_traces,
            {
                "dpo_margin": dpo_margin,
                "from_preference_feedback": preference,
                "from_corrections": corrections,
                "from_reward_ranking": len(pairs) - preference - corrections,
            },
        ),
    ):
        kept, kept_traces, removed = dedupe(rows, traces)
        files.append(ExportFile(name, fmt, kept, kept_traces, removed, extra))
    return files
