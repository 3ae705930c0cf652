"""Which of Trinity's answers make the gateway fall back to production, and how long its
Retry-After asks to wait (streams.capture.fallback)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from streams.capture.fallback import REASONS, reason_of_status, retry_after_s

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (200, None),
        (201, None),
        (400, None),  # the request's own fault: production would refuse it too
        (401, None),
        (404, None),
        (413, None),
        (422, None),
        (408, "status_408"),
        (429, "status_429"),
        (500, "status_5xx"),
        (502, "status_5xx"),
        (503, "status_5xx"),
        (504, "status_5xx"),
        (599, "status_5xx"),
    ],
)
def test_which_statuses_fall_back(status: int, reason: str | None) -> None:
    assert reason_of_status(status) == reason
    assert reason is None or reason in REASONS


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("5", 5.0),
        ("0", 0.0),
        (" 2.5 ", 2.5),
        ("Sun, 01 Mar 2026 12:00:30 GMT", 30.0),
        ("Sunday, 01-Mar-26 12:01:00 GMT", 60.0),  # the obsolete RFC 850 form
        ("Sun, 01 Mar 2026 11:59:00 GMT", 0.0),  # a date gone by: now
        ("-3", None),
        ("nan", None),
        ("inf", None),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_in_seconds_or_as_a_date(header: str | None, seconds: float | None) -> None:
    assert retry_after_s(header, NOW) == seconds
