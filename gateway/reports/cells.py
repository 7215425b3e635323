"""The report page's building blocks: escaped text, table cells (trend, time to drain, who, topic),
cards, tables and images. Each returns a piece of HTML; :mod:`gateway.reports.render` puts them
in sections. The classes they use are report.css's."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.reports.formatting import duration, rate

ROW_LIMIT = 200  # rows per table in the page; the CSV/Parquet tables have all of them


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def trend(v: float | None, status: str | None = None) -> str:
    """The lag's slope; red (growing) or green (shrinking) only when ``status`` (the row's
    ``drain_status``) says the trend is beyond noise, when a status is given."""
    if v is None:
        return '<span class="muted">—</span>'
    if abs(v) < 0.005:  # would print as 0.00
        return '<span class="muted">≈ 0/s</span>' if v else '<span class="muted">0/s</span>'
    up, down = ("bad", "good") if status is None else \
        ("bad" if status == "never" else "muted", "good" if status == "draining" else "muted")
    if v > 0:
        return f'<span class="{up}">▲ +{rate(v)}/s</span>'
    if v < 0:
        return f'<span class="{down}">▼ {rate(v)}/s</span>'
    return '<span class="muted">0/s</span>'


def drain(status: str | None, s: float | None) -> str:
    """Time to drain: a pill for never, no lag and steady; the time when draining."""
    if status == "never":
        return '<span class="pill red" title="the lag grows beyond noise">never</span>'
    if status == "drained":
        return '<span class="pill green">no lag</span>'
    if status == "steady":
        return ('<span class="pill grey" title="the lag neither grows nor shrinks beyond noise">'
                'steady</span>')
    if status == "unknown":
        return '<span class="muted">unknown</span>'
    return esc(duration(s))


def who(r: Mapping[str, Any]) -> str:
    """The consumer in bold, and its clientId (broadcast) beside it."""
    c = f"<b>{esc(r['consumer'])}</b>"
    k = r.get("client_id")
    return c + (f' <span class="muted">/ {esc(k)}</span>' if k else "")


def topic(r: Mapping[str, Any]) -> str:
    """The topic, prefixed with its broker unless that is the default (Kafka)."""
    b = r.get("broker")
    return esc(r["topic"] if b in (None, "", "kafka") else f"{b}:{r['topic']}")


def img(png: bytes | None, alt: str) -> str:
    """A chart inline, as a data URI (the page has no external assets)."""
    if not png:
        return '<p class="empty">No data for this chart.</p>'
    return (f'<img alt="{esc(alt)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode("ascii")}">')


def table(head: Sequence[str], rows: Sequence[Sequence[str]], total: int, file: str,
          numeric: Sequence[int] = (), visible: int = 20) -> str:
    """The first ``visible`` rows, the rest (of at most ROW_LIMIT) folded under a <details>."""
    ths = "".join(f'<th class="{"num" if i in numeric else ""}">{h}</th>'
                  for i, h in enumerate(head))

    def body(rs: Sequence[Sequence[str]]) -> str:
        trs = "".join("<tr>" + "".join(f'<td class="{"num" if i in numeric else ""}">{c}</td>'
                                       for i, c in enumerate(r)) + "</tr>" for r in rs)
        return f"<table><thead><tr>{ths}</tr></thead><tbody>{trs}</tbody></table>"

    rows = rows[:ROW_LIMIT]
    out = body(rows[:visible])
    if len(rows) > visible:
        out += (f'<details><summary>{len(rows) - visible:,} more rows</summary>'
                f"{body(rows[visible:])}</details>")
    if total > len(rows):
        out += (f'<p class="muted small">The page lists {len(rows):,} of {total:,} rows; all of '
                f"them are in <code>{esc(file)}</code>.</p>")
    return out


def card(label: str, value: str, sub: str = "", tone: str = "") -> str:
    """A headline figure: ``tone`` is its colour (red, amber, green, blue)."""
    return (f'<div class="card {tone}"><div class="label">{label}</div>'
            f'<div class="value">{value}</div><div class="sub">{sub}</div></div>')
