"""Unit tests of streams.export.redact: what is caught, what is left alone, and the counts."""

from __future__ import annotations

import pytest

from streams.errors import ConfigError
from streams.export.redact import KINDS, Redactor

CAUGHT = [
    # e-mail addresses
    ("write to bob@example.com today", "write to [EMAIL] today", "email"),
    ("jane.doe+spam@mail.example.co.uk", "[EMAIL]", "email"),
    ("<first_last@sub-domain.example.org>", "<[EMAIL]>", "email"),
    # phone numbers: international
    ("call +44 20 7946 0958", "call [PHONE]", "phone"),
    ("+1-415-555-0100 is the desk", "[PHONE] is the desk", "phone"),
    ("+33612345678", "[PHONE]", "phone"),
    ("+49 (0)30 1234567", "[PHONE]", "phone"),
    ("+91 98765 43210", "[PHONE]", "phone"),
    # phone numbers: US
    ("(415) 555-0100", "[PHONE]", "phone"),
    ("415-555-0100", "[PHONE]", "phone"),
    ("415.555.0100", "[PHONE]", "phone"),
    ("tel 415 555 0100.", "tel [PHONE].", "phone"),
    # phone numbers: European national formats
    ("06 12 34 56 78", "[PHONE]", "phone"),
    ("030 1234567", "[PHONE]", "phone"),
    ("020 7946 0958", "[PHONE]", "phone"),
    ("0170/1234567", "[PHONE]", "phone"),
    # API keys and secrets
    ("key sk-abcdefghijklmnopqrstuvwxyz012345", "key [SECRET]", "secret"),
    ("sk-proj-AbCdEfGhIjKlMnOpQrStUvWx-_12", "[SECRET]", "secret"),
    ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123", "[SECRET]", "secret"),
    ("AKIAIOSFODNN7EXAMPLE", "[SECRET]", "secret"),
    ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "[SECRET]", "secret"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv", "[SECRET]", "secret"),
    ("xoxb-123456789012-abcdefghijkl", "[SECRET]", "secret"),
    ("xoxp-123456789012-abcdefghijkl", "[SECRET]", "secret"),
    ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "[SECRET]", "secret"),
    ("api_key=0123456789abcdef0123456789abcdef", "api_key=[SECRET]", "secret"),
    ('"token": "c2VjcmV0c2VjcmV0c2VjcmV0"', '"token": "[SECRET]"', "secret"),
    ("ACCESS_TOKEN: 9f86d081884c7d659a2feaa0c55ad015", "ACCESS_TOKEN: [SECRET]", "secret"),
    (
        "Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456",
        "Authorization: Bearer [SECRET]",
        "secret",
    ),
    ("password=hunter2", "password=[SECRET]", "secret"),
    (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "[SECRET]",
        "secret",
    ),
]


@pytest.mark.parametrize(("text", "expected", "kind"), CAUGHT, ids=[c[0][:30] for c in CAUGHT])
def test_caught(text: str, expected: str, kind: str) -> None:
    r = Redactor()
    assert r.redact(text) == expected
    assert r.counts == {kind: 1}


LEFT_ALONE = [
    "order #123456789 shipped",
    "2026-01-31T12:00:00.000Z",
    "2026-01-31 12:00:00",
    "version 1.2.3 of 10.4.22",
    "pi is 3.14159265358979",
    "uuid 550e8400-e29b-41d4-a716-446655440000",
    "chatcmpl-0a1b2c3d4e5f67890a1b2c3d",
    "12:30:45",
    "ip 192.168.100.200",
    "price 1,234,567.89 EUR",
    "the sk-learn library",
    "token=abc (short, not a secret)",
    "call_id 9f86d081884c7d659a2feaa0c55ad015",
    "user@localhost",
    "ISBN 978-3-16-148410-0",
]


@pytest.mark.parametrize("text", LEFT_ALONE)
def test_left_alone(text: str) -> None:
    r = Redactor()
    assert r.redact(text) == text
    assert not r.counts


def test_several_kinds_in_one_text_are_counted_per_kind() -> None:
    r = Redactor()
    text = (
        "Hi, I'm bob@example.com, +1 415 555 0100 or 020 7946 0958; my key is "
        "sk-abcdefghijklmnopqrstuvwx and alice@example.org knows it."
    )
    assert r.redact(text) == (
        "Hi, I'm [EMAIL], [PHONE] or [PHONE]; my key is [SECRET] and [EMAIL] knows it."
    )
    assert r.counts == {"email": 2, "phone": 2, "secret": 1}
    assert r.summary()["counts"] == {"custom": 0, "secret": 1, "email": 2, "phone": 2}
    assert r.summary()["total"] == 5


def test_user_patterns_come_first_and_are_counted_as_custom() -> None:
    r = Redactor(patterns=[r"ACME-\d+", r"(?i)project\s+falcon"])
    assert r.redact("ticket ACME-1234 for Project Falcon, mail a@b.io") == (
        "ticket [REDACTED] for [REDACTED], mail [EMAIL]"
    )
    assert r.counts == {"custom": 2, "email": 1}


def test_user_patterns_alone_redact_only_them() -> None:
    r = Redactor(patterns=[r"secret-\w+"], enabled=False)
    assert r.enabled
    assert r.redact("secret-plan for bob@example.com") == "[REDACTED] for bob@example.com"


def test_a_bad_pattern_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"bad --redact-pattern '\(unclosed'"):
        Redactor(patterns=["(unclosed"])


def test_disabled_changes_nothing() -> None:
    r = Redactor(enabled=False)
    assert r.redact("bob@example.com") == "bob@example.com"
    value = {"a": ["bob@example.com"]}
    assert r.redact_obj(value) is value
    assert r.summary() == {
        "enabled": False,
        "patterns": [],
        "counts": dict.fromkeys(KINDS, 0),
        "total": 0,
    }


def test_redact_obj_walks_json_and_leaves_ids_and_timestamps() -> None:
    r = Redactor()
    row = {
        "call_id": "bob@example.com",  # an id must still trace the row back
        "event_time": "2026-01-31T12:00:00Z",
        "messages": [{"role": "user", "content": "I'm bob@example.com"}],
        "metadata": {"phone": "+44 20 7946 0958"},
        "task_id": "support-bob@example.com",
        "n": 3,
        "ok": True,
        "none": None,
    }
    out = r.redact_obj(row)
    assert out["call_id"] == "bob@example.com"
    assert out["messages"][0]["content"] == "I'm [EMAIL]"
    assert out["metadata"]["phone"] == "[PHONE]"
    assert out["task_id"] == "[EMAIL]"
    assert (out["n"], out["ok"], out["none"]) == (3, True, None)
    assert row["messages"][0]["content"] == "I'm bob@example.com"  # a copy, not in place
    assert r.counts == {"email": 2, "phone": 1}
