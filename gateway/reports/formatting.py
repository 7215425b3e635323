"""How the report writes numbers, rates, durations and times, in the page and on the charts alike
(plain text: the HTML escaping and markup are :mod:`gateway.reports.cells`')."""

from __future__ import annotations

import datetime as dt

NONE = "—"  # a figure that does not exist (a rate over a single sample, a missing value)


def num(v: float | None) -> str:
    """A count: ``12,345``."""
    return NONE if v is None else f"{v:,.0f}"


def rate(v: float | None) -> str:
    """A rate per second, to three significant figures at most: ``1,234``, ``12.3``, ``1.23``."""
    if v is None:
        return NONE
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:,.1f}" if a >= 10 else f"{v:,.2f}"


def plain_trend(v: float | None) -> str:
    """A lag slope as text, with its sign: ``+1.23/s``."""
    if v is None:
        return NONE
    return f"{'+' if v > 0 else ''}{rate(v)}/s"


def human_int(v: int | None) -> str:
    """A large count for a card: ``4.20M``, ``1.23G``, or ``12,345`` below a million."""
    if v is None:
        return NONE
    for div, unit in ((1e9, "G"), (1e6, "M")):
        if abs(v) >= div:
            return f"{v / div:.2f}{unit}"
    return f"{v:,}"


def human(v: float) -> str:
    """A compact figure for a chart's axis or label: 12 -> '12', 12_345 -> '12.3k', 4_200_000 ->
    '4.2M'."""
    a = abs(v)
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            s = f"{v / div:.1f}".rstrip("0").rstrip(".")
            return s + unit
    return f"{v:.0f}" if a >= 10 or v == int(v) else f"{v:.2g}"


def duration(s: float | None) -> str:
    """Seconds as the two largest units: ``350ms``, ``45s``, ``2m 05s``, ``1h``, ``3d 04h``."""
    if s is None:
        return NONE
    if 0 < s < 1:
        return f"{s * 1000:.0f}ms"
    s = round(s)
    for big, bu, small, su in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if s >= big:
            rest = s % big // small
            return f"{s // big}{bu}" + (f" {rest:02d}{su}" if rest else "")
    return f"{s}s"


def when(ms: int | None) -> str:
    """Epoch ms as a UTC time, ``2024-05-01 23:30:00``; ``never`` for none."""
    if ms is None:
        return "never"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def day(iso: str) -> str:
    """'2024-05-01T23:30:00.000Z' -> '2024-05-01 23:30:00'."""
    return iso.replace("T", " ")[:19]
