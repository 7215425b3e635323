"""RFC 3339 date-times (gateway/core/timeparse.py): what section 5.6 accepts and what it refuses.

Before, ``deliverAt`` was read with ``datetime.fromisoformat``: ISO 8601, which took ``+05``,
week dates, an empty fraction and more, and refused a lower-case ``t``/``z`` and ``:60``.
"""

from __future__ import annotations

import datetime as dt

import pytest

from gateway.core.timeparse import MIN_EPOCH_MS, parse_rfc3339


def _ms(text: str) -> int:
    """What Python makes of an unambiguous ISO string, for the expected values."""
    return round(dt.datetime.fromisoformat(text).timestamp() * 1000)


ACCEPTED: list[tuple[str, int]] = [
    ("2026-11-25T20:00:00Z", _ms("2026-11-25T20:00:00+00:00")),
    ("2026-11-25t20:00:00z", _ms("2026-11-25T20:00:00+00:00")),  # lower case: allowed (5.6 NOTE)
    ("2026-11-25T20:00:00+05:30", _ms("2026-11-25T20:00:00+05:30")),
    ("2026-11-25T20:00:00-08:00", _ms("2026-11-25T20:00:00-08:00")),
    ("2026-11-25T20:00:00-00:00", _ms("2026-11-25T20:00:00+00:00")),  # unknown offset: UTC (4.3)
    ("2026-11-25T20:00:00+23:59", _ms("2026-11-25T20:00:00+23:59")),
    ("2026-11-25T20:00:00.5Z", _ms("2026-11-25T20:00:00+00:00") + 500),
    ("2026-11-25T20:00:00.123Z", _ms("2026-11-25T20:00:00+00:00") + 123),
    ("2026-11-25T20:00:00.123000000Z", _ms("2026-11-25T20:00:00+00:00") + 123),
    # finer than a millisecond: rounded up, never earlier than asked
    ("2026-11-25T20:00:00.1231Z", _ms("2026-11-25T20:00:00+00:00") + 124),
    ("2026-11-25T20:00:00.0000001Z", _ms("2026-11-25T20:00:00+00:00") + 1),
    ("2024-02-29T00:00:00Z", _ms("2024-02-29T00:00:00+00:00")),  # leap year
    ("2000-02-29T00:00:00Z", _ms("2000-02-29T00:00:00+00:00")),  # divisible by 400
    ("1970-01-01T00:00:00Z", 0),
    ("1969-12-31T23:59:59Z", -1000),  # grammatical; the range is the caller's to check
    ("0000-01-01T00:00:00Z", -62_167_219_200_000),
    ("9999-12-31T23:59:59.999Z", 253_402_300_799_999),
    ("9999-12-31T23:59:59-23:59", 253_402_300_799_000 + 86_340_000),  # past 9999: no overflow
    # leap seconds: the last second of a UTC month; any instant in it is the first ms after it
    ("2016-12-31T23:59:60Z", _ms("2017-01-01T00:00:00+00:00")),
    ("2016-12-31T23:59:60.999Z", _ms("2017-01-01T00:00:00+00:00")),
    ("2016-12-31T15:59:60-08:00", _ms("2017-01-01T00:00:00+00:00")),  # the same instant
    ("2017-01-01T05:29:60+05:30", _ms("2017-01-01T00:00:00+00:00")),
    ("2015-06-30T23:59:60Z", _ms("2015-07-01T00:00:00+00:00")),
    ("2027-03-31T23:59:60Z", _ms("2027-04-01T00:00:00+00:00")),  # any month may have one
]

REFUSED: list[str] = [
    "",
    "2026-11-25",  # a date alone
    "20:00:00Z",  # a time alone
    "2026-11-25T20:00:00",  # no offset
    "2026-11-25T20:00Z",  # no seconds
    "2026-11-25T20:00:00+05",  # offset without minutes
    "2026-11-25T20:00:00+0530",  # offset without colon
    "2026-11-25T20:00:00+5:30",
    "2026-11-25T20:00:00.Z",  # empty fraction
    "2026-11-25T20:00:00,5Z",  # ISO 8601's comma
    "2026-11-25 20:00:00Z",  # a space for the T
    "2026-11-25_20:00:00Z",
    "20261125T200000Z",  # ISO 8601 basic format
    "2026-W48-3T20:00:00Z",  # week date
    "2026-329T20:00:00Z",  # ordinal date
    "+2026-11-25T20:00:00Z",  # expanded year
    "12026-11-25T20:00:00Z",
    "226-11-25T20:00:00Z",
    "2026-1-25T20:00:00Z",
    "2026-11-25T20:00:00Z\x00",  # an embedded NUL
    "2026-11-25T20:00\x00:00Z",
    "2026-11-25T20:00:00Z\n",  # a trailing newline ($ in a regex would take it)
    " 2026-11-25T20:00:00Z",
    "2026-11-25T20:00:00Zjunk",
    "2026-11-25T20:00:00ZZ",
    "２０２６-11-25T20:00:00Z",  # non-ASCII digits
    "2026-11-25T20:00:00.５Z",
    "2026-11-25T20:00:00UTC",
    "2026-11-25T20:00:00GMT+1",
    "2026-00-25T20:00:00Z",  # month 00
    "2026-13-25T20:00:00Z",
    "2026-11-00T20:00:00Z",
    "2026-11-31T20:00:00Z",  # November has 30 days
    "2026-02-29T20:00:00Z",  # not a leap year
    "1900-02-29T20:00:00Z",  # divisible by 100, not by 400
    "2026-11-25T24:00:00Z",  # hour 24
    "2026-11-25T20:60:00Z",
    "2026-11-25T20:00:61Z",
    "2026-11-25T20:00:00+24:00",
    "2026-11-25T20:00:00+05:60",
    "2016-12-31T23:58:60Z",  # a leap second only in the last minute of a UTC month
    "2016-12-30T23:59:60Z",  # ... on its last day
    "2016-12-31T23:59:60+01:00",  # 22:59:60 UTC
    "2016-12-31T15:59:60Z",
]


@pytest.mark.parametrize(("text", "ms"), ACCEPTED)
def test_accepted(text: str, ms: int) -> None:
    assert parse_rfc3339(text) == ms


@pytest.mark.parametrize("text", REFUSED)
def test_refused(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_rfc3339(text)
    assert str(e.value)  # a reason for the error message


def test_reasons_name_the_field() -> None:
    for text, reason in [("2026-13-01T00:00:00Z", "month 13"), ("2026-02-30T00:00:00Z", "day 30"),
                         ("2026-11-25T20:00:00+05", "RFC 3339"), ("2016-12-30T23:59:60Z", "leap")]:
        with pytest.raises(ValueError, match=reason):
            parse_rfc3339(text)


def test_agrees_with_datetime_on_a_sweep() -> None:
    """Days spread over 400 years (one Gregorian cycle), with offsets: the arithmetic is
    datetime's. 89 days apart, a prime: every day of the month and every month come up."""
    day = dt.datetime(1970, 1, 1, 13, 7, 9, tzinfo=dt.UTC)
    for i in range(0, 146_097, 89):
        t = day + dt.timedelta(days=i)
        for off in ("Z", "+14:00", "-12:45"):
            text = t.strftime("%Y-%m-%dT%H:%M:%S") + off
            assert parse_rfc3339(text) == _ms(text.replace("Z", "+00:00")), text


def test_min_epoch_ms_is_1973_in_ms_and_5138_in_seconds() -> None:
    assert dt.datetime.fromtimestamp(MIN_EPOCH_MS / 1000, dt.UTC).year == 1973
    assert dt.datetime(5138, 1, 1, tzinfo=dt.UTC).timestamp() < MIN_EPOCH_MS
