"""Why a request of a call routed to the policy was answered by production: the reasons the
gateway records (``Completion.fallback``, the ``X-Trajstream-Fallback`` header, the
``reason`` label of ``trajstream_gateway_policy_fallbacks_total``), which of Trinity's answers
are failures, and its ``Retry-After``.

==================  ===========================================================================
reason              the request to Trinity...
==================  ===========================================================================
``connect``         could not be made or was cut before an answer: refused, reset, unreachable
``timeout``         had no first byte within ``gateway.policy_timeout_s`` (a streamed answer:
                    its first chunk; a non-streamed one: the whole answer)
``status_5xx``      was answered with a 5xx status
``status_429``      was answered 429 (too many requests)
``status_408``      was answered 408 (request timeout)
``bad_answer``      was answered 200 with something that is not an answer (not JSON)
``breaker_open``    was not sent: the circuit breaker is open (:mod:`.breaker`)
``sticky``          was not sent: an earlier request of the same call fell back, and a call
                    stays with one upstream from then on
==================  ===========================================================================

Any other status (a 4xx but 408 and 429) is the request's own fault: it reaches the client as
Trinity answered it, as it would from production.

May import: the standard library only.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = [
    "BAD_ANSWER",
    "BREAKER_OPEN",
    "CONNECT",
    "REASONS",
    "STATUS_5XX",
    "STATUS_408",
    "STATUS_429",
    "STICKY",
    "TIMEOUT",
    "reason_of_status",
    "retry_after_s",
]

CONNECT = "connect"
TIMEOUT = "timeout"
STATUS_5XX = "status_5xx"
STATUS_429 = "status_429"
STATUS_408 = "status_408"
BAD_ANSWER = "bad_answer"
BREAKER_OPEN = "breaker_open"
STICKY = "sticky"

REASONS = (CONNECT, TIMEOUT, STATUS_5XX, STATUS_429, STATUS_408, BAD_ANSWER, BREAKER_OPEN, STICKY)
"""Every reason, in the order the reference lists them."""


def reason_of_status(status: int) -> str | None:
    """The fallback reason of an answer with ``status`` from Trinity; None: no failure (the
    answer goes to the client as it is).

    >>> [reason_of_status(s) for s in (200, 400, 404, 408, 429, 500, 503, 504)]
    [None, None, None, 'status_408', 'status_429', 'status_5xx', 'status_5xx', 'status_5xx']
    """
    if status >= 500:
        return STATUS_5XX
    if status == 429:
        return STATUS_429
    if status == 408:
        return STATUS_408
    return None


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delay-seconds or an HTTP date (RFC 9110
    section 10.2.3); None when absent or not understood, 0 for a date in the past.

    >>> retry_after_s("5"), retry_after_s(" 2.5 "), retry_after_s("soon"), retry_after_s(None)
    (5.0, 2.5, None, None)
    >>> now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    >>> retry_after_s("Thu, 01 Jan 2026 12:00:30 GMT", now)
    30.0
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
        return max(0.0, seconds)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds
