"""CORRECTION feedback in exports: a DPO pair (the correction preferred over the output it
corrects) and an SFT row (the prompt, then the correction), table-driven; and both counted in
the replay's export files."""

from __future__ import annotations

from typing import Any

import pytest

from streams.core.backfill import Outcome
from streams.core.rewards import Rewarder, success
from streams.export.build import build_exports
from streams.export.dataset import DpoRow, SftRow, correction_pairs, correction_sft_rows
from streams.export.redact import Redactor
from streams.models import CallStatus, ChatMessage, FeedbackKind, Trajectory
from tests.unit.export.test_dataset import agent_run, llm
from tests.unit.factories import T0, feedback

PROMPT = [ChatMessage(role="user", content="Capital of Australia?")]


def corr(text: str | None, **kw: Any) -> Any:
    return feedback(kind=FeedbackKind.CORRECTION, rating=None, correction=text, **kw)


def run() -> Trajectory:
    return agent_run(
        input_messages=PROMPT,
        steps=[
            llm(0, "Sydney.", input_messages=PROMPT, response_id="r-0"),
            llm(1, "Sydney, surely.", input_messages=PROMPT, response_id="r-1"),
        ],
        output="Sydney, surely.",
    )


@pytest.mark.parametrize(
    ("fb", "rejected", "corrected_id"),
    [
        # no response named: the call's last answer is corrected
        (corr("Canberra."), "Sydney, surely.", "r-1"),
        # the response it names
        (corr("Canberra.", response_id="r-0"), "Sydney.", "r-0"),
        # an unknown response id: the last answer
        (corr("Canberra.", response_id="nope"), "Sydney, surely.", "r-1"),
        # surrounding blanks are not part of the correction
        (corr("  Canberra.\n"), "Sydney, surely.", "r-1"),
    ],
)
def test_a_correction_is_preferred_over_what_it_corrects(
    fb: Any, rejected: str, corrected_id: str
) -> None:
    [pair] = correction_pairs(run(), [fb])
    DpoRow.model_validate(pair.row)
    assert pair.row == {
        "input": {"messages": [{"role": "user", "content": "Capital of Australia?"}]},
        "preferred_output": [{"role": "assistant", "content": "Canberra."}],
        "non_preferred_output": [{"role": "assistant", "content": rejected}],
    }
    assert pair.trace == {
        "source": "correction",
        "call_id": "call-1",
        "feedback_event_id": fb.event_id,
        "corrected_response_id": corrected_id,
    }
    [sft] = correction_sft_rows(run(), [fb])
    SftRow.model_validate(sft.row)
    assert sft.row["messages"] == [
        {"role": "user", "content": "Capital of Australia?"},
        {"role": "assistant", "content": "Canberra."},
    ]
    assert sft.trace == pair.trace


@pytest.mark.parametrize(
    ("fb", "pairs", "sft"),
    [
        (corr(None), 0, 0),  # no text
        (corr("   "), 0, 0),
        (corr("Sydney, surely."), 0, 1),  # equal to the output: no pair, still a good answer
        (feedback(rating=1.0), 0, 0),  # not a correction
        (feedback(kind=FeedbackKind.THUMBS, rating=None, thumbs_up=False), 0, 0),
    ],
    ids=["no-text", "blank", "same-as-output", "rating", "thumbs"],
)
def test_what_makes_no_row(fb: Any, pairs: int, sft: int) -> None:
    assert len(correction_pairs(run(), [fb])) == pairs
    assert len(correction_sft_rows(run(), [fb])) == sft


def test_a_call_without_recorded_llm_output_pairs_its_input_and_output() -> None:
    traj = agent_run(input_messages=PROMPT, steps=[], output="Sydney.")
    [pair] = correction_pairs(traj, [corr("Canberra.")])
    assert pair.row["non_preferred_output"][0]["content"] == "Sydney."
    assert pair.trace["corrected_response_id"] is None


def test_exports_carry_corrections_whatever_the_reward() -> None:
    traj = run().model_copy(update={"status": CallStatus.ERROR})
    rewarded = Rewarder(success)(traj)
    assert rewarded.reward == 0.0  # below min_reward: no SFT row of its own
    fb = corr("Canberra.")
    outcome = Outcome(traj, T0, 0, [rewarded], [None], [[fb]], feedback=[fb])
    files = {
        f.name: f
        for f in build_exports([outcome], min_reward=0.5, dpo_margin=0.5, redactor=Redactor())
    }
    sft, dpo = files["sft.jsonl"], files["dpo.jsonl"]
    assert sft.extra["from_corrections"] == 1 and sft.extra["below_min_reward"] == 1
    assert sft.rows[0]["messages"][-1] == {"role": "assistant", "content": "Canberra."}
    assert dpo.extra["from_corrections"] == 1 and dpo.extra["from_preference_feedback"] == 0
    assert dpo.rows[0]["preferred_output"][0]["content"] == "Canberra."
    assert dpo.traces[0]["source"] == "correction"
