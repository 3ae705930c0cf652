"""The policy's version read from Trinity's /metrics or an answer's header, and how long the
gateway trusts it (streams.capture.policy_version)."""

from __future__ import annotations

import pytest

from streams.capture.policy_version import VersionBook, version_of_header, version_of_metrics


def key(i: int) -> str:
    return f"rollout/model_{i}/model_version"


@pytest.mark.parametrize(
    ("metrics", "version"),
    [
        ({key(0): 4, "explore_step_num": 9}, 4),
        ({key(0): 4, key(1): 4, key(2): 4}, 4),
        ({key(0): 4, key(1): 5}, None),  # a weight sync going from one model to the next
        ({"explore_step_num": 9}, None),
        ({key(0): "4"}, None),
        ({key(0): True}, None),
        ({key(0): -1}, None),
        ({"rollout/model_x/model_version": 4}, None),
        ([], None),
        (None, None),
    ],
)
def test_the_version_is_the_one_every_rollout_model_is_on(
    metrics: object, version: int | None
) -> None:
    assert version_of_metrics(metrics) == version


@pytest.mark.parametrize(
    ("header", "version"),
    [("7", 7), (" 12 ", 12), ("0", 0), ("-1", None), ("v3", None), ("", None), (None, None)],
)
def test_an_answers_version_header(header: str | None, version: int | None) -> None:
    assert version_of_header(header) == version


def test_a_version_is_known_while_it_is_fresh_and_forgotten_when_the_policy_fails() -> None:
    now = [100.0]
    book = VersionBook(max_age_s=15, clock=lambda: now[0])
    assert book.current is None
    book.observe(3)
    now[0] = 115.0
    assert book.current == 3
    now[0] = 115.1
    assert book.current is None  # too old to be sure of
    book.observe(4)
    assert book.current == 4
    book.forget()
    assert book.current is None
    book.observe(None)  # a read that found no one version
    assert book.current is None
