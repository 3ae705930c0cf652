"""Redaction: personal data and secrets taken out of text before it leaves the pipeline.

A :class:`Redactor` replaces e-mail addresses with ``[EMAIL]``, phone numbers with ``[PHONE]``,
API keys and other credentials with ``[SECRET]`` and whatever the user's own patterns match
with ``[REDACTED]``, and counts what it replaced, per kind, for the export manifest. Replay
applies it to every row written to files and to the ``task_id`` sent to Trinity.

Order matters: the user's patterns first (they are the most specific), then secrets (a key like
``sk-...`` contains digit runs a phone pattern could take), then e-mail addresses, then phone
numbers. Phone numbers need a ``+`` country code or the separators of a common national format
and 9 to 15 digits, so order numbers, dates and timestamps are left alone.

Example::

    r = Redactor(patterns=[r"ACME-\\d+"])
    r.redact("mail bob@example.com, key sk-abcdefghijklmnopqrstuvwx, ticket ACME-1234")
    # 'mail [EMAIL], key [SECRET], ticket [REDACTED]'
    r.counts   # Counter({'custom': 1, 'secret': 1, 'email': 1})

May import: the standard library, :mod:`streams.errors`.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["KINDS", "STRUCTURAL_KEYS", "Redactor"]

KINDS = ("custom", "secret", "email", "phone")
"""The kinds of redaction, in the order they are applied; the keys of :attr:`Redactor.counts`."""

STRUCTURAL_KEYS = frozenset(
    {
        "event_id",
        "call_id",
        "trajectory_id",
        "response_id",
        "preferred_response_id",
        "msg_ids",
        "event_time",
        "marked_at",
        "started_at",
        "ended_at",
        "acked_at",
        "phase",
        "kind",
        "status",
        "role",
        "seq",
        "run_id",
        "reward",
        "reward_fn",
        "reward_version",
        "closed_reason",
        "tool_call_id",
        "id",
        "type",
        "finish_reasons",
    }
)
"""Keys of ids, timestamps and enumerations: :meth:`Redactor.redact_obj` leaves their values be
(a timestamp is not a phone number, and a call id must still trace a row back)."""


@dataclass(frozen=True)
class _Rule:
    kind: str
    label: str
    pattern: re.Pattern[str]
    group: int = 0  # replace only this group (0: the whole match)
    check: Callable[[str], bool] | None = None


def _digits_between(low: int, high: int) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        return low <= sum(ch.isdigit() for ch in text) <= high

    return check


_SECRET_VALUE = r"[A-Za-z0-9+/_\-.~]{16,}={0,2}"

_SECRETS = [
    r"\bsk-ant-[A-Za-z0-9_\-]{16,}",  # Anthropic
    r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",  # OpenAI
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key id
    r"\bgh[pousr]_[A-Za-z0-9]{30,}\b",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{30,}\b",
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack
    r"\bAIza[0-9A-Za-z_\-]{35}\b",  # Google API key
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWT
]

_RULES: list[_Rule] = [
    *(_Rule("secret", "[SECRET]", re.compile(p)) for p in _SECRETS),
    # a long value after key=, token:, password=, ... (the name stays, the value goes)
    _Rule(
        "secret",
        "[SECRET]",
        re.compile(
            r"(?i)\b(?:api[_-]?key|apikey|access[_-]?key|secret(?:[_-]?key)?|token|"
            r"access[_-]?token|auth[_-]?token|password|passwd|pwd|client[_-]?secret)"
            r"[\"']?\s*[=:]\s*[\"']?(" + _SECRET_VALUE + ")"
        ),
        group=1,
    ),
    _Rule("secret", "[SECRET]", re.compile(r"(?i)\bBearer\s+(" + _SECRET_VALUE + ")"), group=1),
    # a password of any length after password= / pwd:
    _Rule(
        "secret",
        "[SECRET]",
        re.compile(r"(?i)\b(?:password|passwd|pwd)[\"']?\s*[=:]\s*[\"']?([^\s\"',;\[]{4,})"),
        group=1,
    ),
    _Rule(
        "email",
        "[EMAIL]",
        re.compile(r"\b[A-Za-z0-9._%+\-]+@(?:[A-Za-z0-9\-]+\.)+[A-Za-z]{2,}\b"),
    ),
    # international: +CC and groups of digits, e.g. +44 20 7946 0958, +1-415-555-0100
    _Rule(
        "phone",
        "[PHONE]",
        re.compile(r"(?<![\w+])\+\d{1,3}(?:[\s.\-]?\(\d{1,4}\))?(?:[\s.\-]?\d{1,5}){2,6}\b"),
        check=_digits_between(8, 15),
    ),
    # US: (415) 555-0100, 415-555-0100, 415.555.0100, 415 555 0100
    _Rule(
        "phone",
        "[PHONE]",
        re.compile(r"(?<![\w\-.])(?:\(\d{3}\)\s?|\d{3}[\-.\s])\d{3}[\-.\s]\d{4}(?![\w\-]|\.\d)"),
    ),
    # European national formats, leading 0: 06 12 34 56 78, 030 1234567, 020 7946 0958
    _Rule(
        "phone",
        "[PHONE]",
        re.compile(r"(?<![\w\-.:/])0\d{1,4}(?:[ /\-]\d{2,8}){1,4}(?![\w\-:]|\.\d)"),
        check=_digits_between(9, 13),
    ),
]


class Redactor:
    """Replaces e-mails, phone numbers, secrets and custom patterns, counting per kind.

    ``patterns`` are extra regular expressions (Python syntax); an invalid one is a
    :class:`~streams.errors.ConfigError`. ``enabled=False`` gives a redactor that changes
    nothing, so callers need no branches.
    """

    def __init__(self, patterns: Iterable[str] = (), *, enabled: bool = True) -> None:
        custom = []
        for text in patterns:
            try:
                custom.append(_Rule("custom", "[REDACTED]", re.compile(text)))
            except re.error as exc:
                raise ConfigError(f"bad --redact-pattern {text!r}: {exc}") from None
        self.patterns = list(patterns)
        self.enabled = enabled or bool(custom)
        self._rules = [*custom, *_RULES] if enabled else custom
        self.counts: Counter[str] = Counter()

    def redact(self, text: str) -> str:
        """``text`` with every match replaced by its label; :attr:`counts` grows."""
        if not self.enabled or not text:
            return text
        for rule in self._rules:
            text = rule.pattern.sub(functools.partial(self._replace, rule), text)
        return text

    def _replace(self, rule: _Rule, match: re.Match[str]) -> str:
        found = match.group(rule.group)
        if rule.check is not None and not rule.check(found):
            return match.group(0)
        self.counts[rule.kind] += 1
        if rule.group == 0:
            return rule.label
        start, end = match.span(rule.group)
        whole = match.group(0)
        offset = match.start(0)
        return whole[: start - offset] + rule.label + whole[end - offset :]

    def redact_obj(self, value: Any, key: str | None = None) -> Any:
        """A copy of a JSON-like value with every string redacted, except under the
        :data:`STRUCTURAL_KEYS` (ids, timestamps, enumerations)."""
        if not self.enabled:
            return value
        if isinstance(value, str):
            return value if key in STRUCTURAL_KEYS else self.redact(value)
        if isinstance(value, dict):
            return {
                k: self.redact_obj(v, k if isinstance(k, str) else key) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [self.redact_obj(v, key) for v in value]
        return value

    def summary(self) -> dict[str, Any]:
        """For the manifest: whether it ran, the custom patterns, and the counts per kind."""
        return {
            "enabled": self.enabled,
            "patterns": list(self.patterns),
            "counts": {kind: self.counts.get(kind, 0) for kind in KINDS},
            "total": sum(self.counts.values()),
        }
