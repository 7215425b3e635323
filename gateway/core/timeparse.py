"""Instants from the wire: RFC 3339 date-times, and the unit of epoch numbers.

``datetime.fromisoformat`` reads ISO 8601, a much larger language than RFC 3339 (section 5.6):
it takes ``+05`` as an offset, week dates (``2026-W01-1``), ``12:00:00.`` with an empty
fraction, a space for the ``T``, and, depending on the Python version, more; it refuses a lower
case ``t``/``z``, which RFC 3339 allows, and the leap second ``:60``. A value one reader takes
and another refuses is a contract nobody can rely on, so the grammar is written out here::

    date-time   = full-date ("T" / "t") full-time
    full-date   = 4DIGIT "-" 2DIGIT "-" 2DIGIT          ; month 01-12, day 01-28/29/30/31
    full-time   = 2DIGIT ":" 2DIGIT ":" 2DIGIT ["." 1*DIGIT] time-offset
                                                          ; hour 00-23, minute 00-59, second 00-60
    time-offset = "Z" / "z" / ("+" / "-") 2DIGIT ":" 2DIGIT   ; hour 00-23, minute 00-59

DIGIT is ASCII 0-9 only. ``-00:00`` (RFC 3339 4.3: "offset unknown") names the same instant as
``Z``.

**Leap seconds.** ``:60`` is accepted where one can occur (5.7): the last second of a month in
UTC (``23:59:60Z``, or the same instant written with an offset, ``15:59:60-08:00``). Unix time
has no number for it, so every instant inside it (``:60`` to ``:60.999…``) maps to the first
millisecond after it, ``00:00:00.000Z`` of the next day: a record asked for during a leap second
is delivered as soon as it is over, and never before the instant asked for. For the same reason
a fraction finer than a millisecond is rounded up (``.0001`` is 1 ms).
"""

from __future__ import annotations

import re

#: Epoch numbers below this (1973-03-03T09:46:40Z in milliseconds) are refused as instants in
#: ms: in seconds, 10**11 is the year 5138, so every epoch-seconds value a program could mean
#: today (~1.8e9) is far below it, while every epoch-milliseconds value from March 1973 on is
#: above it. What is lost is 1970 to 1973 in ms: times long past, which a producer has no reason
#: to name (a time already past means "now", which is said by giving none).
MIN_EPOCH_MS = 10**11

_DATE_TIME = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]+))?"
    r"(?:[Zz]|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))")
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
FORM = "YYYY-MM-DDTHH:MM:SS[.fraction] then Z or +HH:MM/-HH:MM; years 0000-9999"


def _leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def _days_in(year: int, month: int) -> int:
    return 29 if month == 2 and _leap(year) else _MONTH_DAYS[month - 1]


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm): plain
    integers, so year 0000 or an offset past 9999-12-31 cannot overflow as ``datetime`` would."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _day_of_month(days: int) -> int:
    """The day of the month (1-31) of ``days`` since 1970-01-01 (inverse of the above)."""
    z = days + 719468
    doe = z - (z // 146097) * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    return doy - (153 * mp + 2) // 5 + 1


def _in(value: int, low: int, high: int, what: str) -> None:
    if not low <= value <= high:
        raise ValueError(f"{what} {value:02d} is not {low:02d}-{high:02d}")


def parse_rfc3339(text: str) -> int:
    """Unix milliseconds of an RFC 3339 ``date-time``; :class:`ValueError` with the reason
    (a phrase, for an error message) for anything else."""
    m = _DATE_TIME.fullmatch(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 date-time ({FORM})")
    year, month, day = int(m["year"]), int(m["month"]), int(m["day"])
    hour, minute, second = int(m["hour"]), int(m["minute"]), int(m["second"])
    _in(month, 1, 12, "month")
    last = _days_in(year, month)
    if not 1 <= day <= last:
        raise ValueError(f"day {day:02d} is not 01-{last} in {year:04d}-{month:02d}")
    _in(hour, 0, 23, "hour")
    _in(minute, 0, 59, "minute")
    _in(second, 0, 60, "second")
    offset_min = 0
    if m["sign"] is not None:
        _in(int(m["off_hour"]), 0, 23, "offset hour")
        _in(int(m["off_minute"]), 0, 59, "offset minute")
        offset_min = (int(m["off_hour"]) * 60 + int(m["off_minute"])) * (-1 if m["sign"] == "-" else 1)
    fraction = m["fraction"] or ""
    # ms of the fraction, rounded up: a due time is never moved earlier
    ms = int(fraction[:3].ljust(3, "0")) + (fraction[3:].strip("0") != "")
    seconds = ((_days_from_civil(year, month, day) * 24 + hour) * 60 + minute - offset_min) * 60 + second
    if second == 60:
        # `seconds` is now the second after the leap second: it must start a UTC month
        if seconds % 86400 or _day_of_month(seconds // 86400) != 1:
            raise ValueError("a leap second (:60) is only the last second of a month in UTC "
                             "(23:59:60Z)")
        ms = 0  # any instant inside it: the first millisecond after it (module docstring)
    return seconds * 1000 + ms
