"""The self-contained HTML report: inline CSS, PNG charts as base64 data URIs, no external assets.

Order is what an operator needs first: headline numbers, then the stuck queues, then where the
lag is (total, top consumers, topics, heat map), then idle consumers, then the definitions.
(Not called ``html.py``: spark-submit puts this directory first on sys.path, where that name
would shadow the standard library's ``html``.)
"""

from __future__ import annotations

import base64
import datetime as dt
import html
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.reports import rates
from gateway.reports.figures import RATE_ROWS

ROW_LIMIT = 200  # rows per table in the page; the CSV/Parquet tables have all of them


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def num(v: int | float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def rate(v: float | None) -> str:
    if v is None:
        return "—"
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:,.1f}" if a >= 10 else f"{v:,.2f}"


def duration(s: float | None) -> str:
    if s is None:
        return "—"
    if 0 < s < 1:
        return f"{s * 1000:.0f}ms"
    s = round(s)
    for big, bu, small, su in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s")):
        if s >= big:
            rest = s % big // small
            return f"{s // big}{bu}" + (f" {rest:02d}{su}" if rest else "")
    return f"{s}s"


def when(ms: int | None) -> str:
    if ms is None:
        return "never"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


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
    c = f"<b>{esc(r['consumer'])}</b>"
    k = r.get("client_id")
    return c + (f' <span class="muted">/ {esc(k)}</span>' if k else "")


def topic(r: Mapping[str, Any]) -> str:
    b = r.get("broker")
    return esc(r["topic"] if b in (None, "", "kafka") else f"{b}:{r['topic']}")


def img(png: bytes | None, alt: str) -> str:
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
    return (f'<div class="card {tone}"><div class="label">{label}</div>'
            f'<div class="value">{value}</div><div class="sub">{sub}</div></div>')


def _stuck_why(r: Mapping[str, Any]) -> str:
    parts = []
    if r.get("reason", "").find("no progress") >= 0:
        parts.append(f'<span class="pill red">no progress {esc(duration(r["stalled_s"]))}</span>')
    if r.get("reason", "").find("lock expired") >= 0:
        parts.append(f'<span class="pill amber">lock held {esc(duration(r["lock_age_ms"] / 1000))}'
                     f' &gt; timeout {esc(duration(r["lock_timeout_ms"] / 1000))}</span>')
    if r.get("paused"):
        parts.append('<span class="pill grey">paused</span>')
    return " ".join(parts)


CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f3f4f6;color:#111827;font:14px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,"DejaVu Sans",sans-serif}
header{background:#111827;color:#f9fafb;padding:18px 32px}
header h1{margin:0;font-size:22px;font-weight:650}
header .meta{color:#d1d5db;margin-top:4px;font-size:13px}
main{max-width:1320px;margin:0 auto;padding:20px 32px 40px}
.cards{display:grid;grid-template-columns:repeat(6,1fr);gap:12px;margin-bottom:18px}
.card{background:#fff;border-radius:10px;padding:12px 14px;border:1px solid #e5e7eb;
border-top:4px solid #9ca3af}
.card .label{color:#4b5563;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:26px;font-weight:700;margin-top:2px;white-space:nowrap}
.card .value small{font-size:14px;font-weight:600;color:#6b7280}
.card .sub{color:#6b7280;font-size:12px;min-height:1em}
.card.red{border-top-color:#dc2626;background:#fef2f2}.card.red .value{color:#b91c1c}
.card.amber{border-top-color:#d97706;background:#fffbeb}.card.amber .value{color:#b45309}
.card.green{border-top-color:#16a34a}.card.green .value{color:#15803d}
.card.blue{border-top-color:#2563eb}
section{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:16px 20px;
margin-bottom:18px}
section h2{margin:0 0 2px;font-size:17px}
section .hint{color:#6b7280;font-size:12.5px;margin:0 0 10px}
section.alert{border-left:6px solid #dc2626}
section.ok{border-left:6px solid #16a34a}
img{max-width:100%;display:block;margin:6px 0 10px}
table{border-collapse:collapse;width:100%;font-size:13px}
th{text-align:left;color:#374151;font-weight:600;border-bottom:2px solid #d1d5db;padding:6px 8px;
background:#f9fafb;position:sticky;top:0}
td{border-bottom:1px solid #eef0f3;padding:5px 8px;vertical-align:top}
tr:nth-child(even) td{background:#fafafa}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.muted{color:#6b7280}.small{font-size:12px}.good{color:#15803d}.bad{color:#b91c1c}
.pill{display:inline-block;border-radius:999px;padding:0 8px;font-size:12px;font-weight:600;
white-space:nowrap}
.pill.red{background:#fee2e2;color:#991b1b}.pill.amber{background:#fef3c7;color:#92400e}
.pill.green{background:#dcfce7;color:#166534}.pill.grey{background:#e5e7eb;color:#374151}
.empty{color:#15803d;font-weight:600;margin:4px 0}
.two{display:grid;grid-template-columns:1fr;gap:8px}
code{background:#f3f4f6;padding:0 4px;border-radius:4px}
dl{display:grid;grid-template-columns:220px 1fr;gap:4px 16px;margin:0;font-size:13px}
dt{font-weight:600}dd{margin:0;color:#374151}
details{margin-top:6px}summary{cursor:pointer;color:#1d4ed8;font-size:13px;padding:4px 0}
footer{color:#6b7280;font-size:12px;text-align:center;padding:8px}
"""


def page(s: Mapping[str, Any], t: Mapping[str, list[dict]],
         charts: Mapping[str, bytes | None]) -> str:
    """The report page from the summary ``s``, the tables ``t`` (lists of row dicts) and charts."""
    w, tot, th = s["window"], s["totals"], s["thresholds"]
    stuck, top, topics, idle = t["stuck"], t["top"], t["topics"], t["idle"]
    consumers, readers = t.get("consumers", []), t.get("readers", [])
    n_stuck, n_idle, n_never = s["counts"]["stuck"], s["counts"]["idle"], s["counts"]["never"]
    slow = [r for r in consumers if rates.behind(r)]
    out = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>Lag report {esc(w['first_sample'])} – {esc(w['last_sample'])}</title>",
        f"<style>{CSS}</style></head><body>",
        "<header><h1>mq-gateway · consumer lag report</h1>",
        f'<div class="meta">{esc(_day(w["first_sample"]))} → {esc(_day(w["last_sample"]))} UTC '
        f'({esc(duration(w["span_s"]))}) · {s["counts"]["samples"]:,} samples · '
        f'{s["counts"]["rows"]:,} rows · {s["counts"]["consumers"]:,} consumers/clientIds · '
        f'{s["counts"]["queues"]:,} queues{_gone(s["counts"].get("gone", 0))} · '
        f'{s["counts"]["topics"]:,} topics{_internal(s.get("internal"))} · '
        f'generated {esc(s["generated_at"])}</div></header><main>',
        '<div class="cards">',
        card("Stuck queues", f"{n_stuck:,}",
             f"no progress &gt; {esc(duration(th['stuck_after_s']))} or lock expired",
             "red" if n_stuck else "green"),
        card("Total lag", human_int(tot["lag"]),
             f"messages · trend {_plain_trend(tot['lag_slope'])}",
             "amber" if (tot["lag_slope"] or 0) > 0 else "blue"),
        card("Never draining", f"{n_never:,}", "queues whose lag grows beyond noise",
             "amber" if n_never else "green"),
        card("Idle", f"{n_idle:,}",
             f"consumers/clientIds, not seen in {esc(duration(th['idle_after_s']))}",
             "amber" if n_idle else "green"),
        card("Produced · per topic", f'{rate(tot["production_rate"])}<small>/s</small>',
             f'into {s["counts"]["topics"]:,} topics, each topic counted once', "blue"),
        _behind_card(slow, len(consumers)),
        "</div>",
    ]
    # 1. stuck
    if stuck:
        rows = [[who(r), topic(r), esc(r["queue"]), _stuck_why(r), num(r["lag"]),
                 num(r["committed_offset"]), rate(r["consumption_rate"]),
                 rate(r["production_rate"])]
                for r in stuck[:ROW_LIMIT]]
        out.append(
            f'<section class="alert"><h2>Stuck queues ({n_stuck:,})</h2>'
            f'<p class="hint">A backlog whose committed offset has not moved for more than '
            f'{esc(duration(th["stuck_after_s"]))}, or a lock held past its consume timeout, in '
            f'the last sample. Longest stall first.{_spread(stuck, n_stuck)}</p>'
            + table(["consumer / clientId", "topic", "queue", "why", "lag", "committed",
                     "consumed/s", "produced/s"], rows, n_stuck, "stuck.csv", (4, 5, 6, 7))
            + "</section>")
    else:
        out.append('<section class="ok"><h2>Stuck queues</h2><p class="empty">None: every queue '
                   'with a backlog made progress, and no lock outlived its timeout.</p></section>')
    # 2. total lag over time
    out.append('<section><h2>Total lag over time</h2><p class="hint">Sum of the lag of every '
               f'queue at each sample{_per_bucket(s, "line_s")}, and how many queues had any '
               'lag.</p>'
               + img(charts.get("total_lag"), "total lag over time") + "</section>")
    # 3. top consumers
    rows = [[str(r["rank"]), who(r), esc(r["mode"]), num(r["lag"]),
             trend(r["lag_slope"], r["drain_status"]),
             rate(r["consumption_rate"]), rate(r["production_rate"]),
             drain(r["drain_status"], r["drain_s"]), num(r["stuck_queues"])] for r in top]
    out.append(
        f'<section><h2>Top {len(top) or ""} consumers by lag</h2>'
        '<p class="hint">One panel per consumer (or clientId), each on its own scale: lag summed '
        "over its queues, its current lag and trend above it (least-squares slope over the "
        "window: ▲ up, ▼ down; red or green only beyond noise). Time to drain = lag ÷ "
        "(consumption − production); never where the lag grows, steady where it neither grows "
        "nor shrinks beyond noise.</p>"
        + img(charts.get("top_lag"), "lag over time of the top consumers")
        + (table(["#", "consumer / clientId", "mode", "lag", "trend", "consumed/s (this consumer)",
                  "produced/s (its topics)", "time to drain", "stuck"], rows, len(rows),
                 "top.csv", (0, 3, 4, 5, 6, 7, 8))
           if rows else '<p class="empty">No consumer has any lag.</p>')
        + "</section>")
    # 4. each consumer against the production of what it reads
    out.append(_rates_section(consumers, readers, s["counts"]["consumers"], charts.get("rates")))
    # 5. topics
    slowest = rates.slowest_readers(readers)
    rows = [[topic(r), num(r["partitions"]), num(r["subscriptions"]), num(r["lag"]),
             trend(r["lag_slope"], r.get("drain_status")), rate(r["production_rate"]),
             _slowest(slowest.get((r["broker"], r["topic"]))), num(r["stuck_queues"])]
            for r in topics[:ROW_LIMIT]]
    out.append(
        '<section><h2>Topics</h2><p class="hint">Produced/s is the topic\'s own figure (from its '
        "partitions' high watermarks over the window), the same for every reader. Lag and trend "
        "are summed over its readers; consumption is not (a sum over readers says nothing about "
        "any one of them): the slowest reader is named instead. Most lag first.</p>"
        + table(["topic", "partitions", "readers", "lag (all readers)", "trend",
                 "produced/s (per topic)", "slowest reader: consumed/s", "stuck"], rows,
                len(topics), "topics.csv", (1, 2, 3, 4, 5, 6, 7))
        + "</section>")
    # 6. heat map
    out.append(
        f'<section><h2>Queues by lag over time</h2><p class="hint">The {s["heatmap"]["rows"]} '
        "queues with the most lag now, most first; each cell is the highest lag in "
        f'{esc(duration(s["buckets"]["heat_s"]))} (white: no lag; grey: no sample for more than '
        f'{esc(duration(1.5 * s["buckets"]["sample_interval_s"]))}, 1.5 sample intervals: the '
        "snapshots stopped, or the queue did not exist yet).</p>"
        + img(charts.get("heatmap"), "heat map of queues by lag") + "</section>")
    # 7. idle
    if idle:
        rows = [[esc(r["kind"]), who(r), esc(r["mode"]), esc(when(r["last_seen_ms"])),
                 esc(duration(r["idle_s"]) if r["idle_s"] is not None else "never seen"),
                 num(r["lag"])] for r in idle[:ROW_LIMIT]]
        out.append(
            f'<section><h2>Idle consumers and clientIds ({n_idle:,})</h2><p class="hint">No '
            f'poll, lock or commit within {esc(duration(th["idle_after_s"]))} of the last sample.</p>'
            + table(["kind", "consumer / clientId", "mode", "last seen (UTC)", "idle for", "lag"],
                    rows, n_idle, "idle.csv", (4, 5)) + "</section>")
    else:
        out.append('<section class="ok"><h2>Idle consumers and clientIds</h2><p class="empty">'
                   f'None: every consumer was active within {esc(duration(th["idle_after_s"]))}.'
                   "</p></section>")
    out.append(DEFINITIONS.format(stuck=esc(duration(th["stuck_after_s"])),
                                  idle=esc(duration(th["idle_after_s"]))))
    out.append(f'</main><footer>Tables: queues, consumers, topics, stuck, idle, top (.parquet and '
               f'.csv) next to this file · Spark {esc(s["spark"]["version"])} on '
               f'{esc(s["spark"]["master"])} · {s["elapsed_s"]:.1f} s</footer></body></html>')
    return "\n".join(out)


def _behind_card(slow: Sequence[Mapping[str, Any]], n: int) -> str:
    """How many consumers fall behind the topics they read (their lag grows), and the worst:
    per consumer against per topic, never a sum of consumption over readers."""
    if not slow:
        return card("Behind production · per consumer", f"0<small> of {n:,}</small>",
                    "consumers: no lag grows beyond noise",
                    "green")
    worst = max(slow, key=lambda r: r["lag"] or 0)
    return card("Behind production · per consumer", f"{len(slow):,}<small> of {n:,}</small>",
                f"most lag: <b>{esc(rates.who(worst))}</b> reads "
                f"{rate(worst['consumption_rate'])}/s, its topics get "
                f"{rate(worst['production_rate'])}/s", "red")


def _slowest(r: Mapping[str, Any] | None) -> str:
    if r is None:
        return "—"
    cls = "bad" if rates.behind(r) else ""
    return (f'<span class="{cls}">{rate(r["consumption_rate"])}</span> '
            f'<span class="muted">{esc(rates.who(r))}</span>')


def _rates_section(consumers: Sequence[Mapping[str, Any]], readers: Sequence[Mapping[str, Any]],
                   total: int, png: bytes | None) -> str:
    """Every consumer against the production of the topics it reads: the chart shows those
    falling behind first, the table under it every consumer (the first rows open)."""
    order = rates.ranked(consumers)
    topics_of = rates.topics_by_reader(readers)
    n_slow = sum(1 for r in order if rates.behind(r))
    rows = []
    for r in order[:ROW_LIMIT]:
        q = rates.ratio(r)
        bad = rates.behind(r)
        rows.append([
            who(r), esc(rates.topics_text(topics_of.get((r["consumer"], r["client_id"]), []), 3)),
            num(r["lag"]), trend(r["lag_slope"], r["drain_status"]), rate(r["consumption_rate"]),
            rate(r["production_rate"]),
            "—" if q is None else f'<span class="{"bad" if bad else "good"}">{q:.0%}</span>',
            drain(r["drain_status"], r["drain_s"])])
    shown = min(len(order), RATE_ROWS)
    chart_note = (f" The chart shows {shown:,} of {len(order):,}, those behind first; the table "
                  "has every one.") if len(order) > shown else ""
    return (
        f'<section><h2>Each consumer against its topics\' production ({n_slow:,} behind)</h2>'
        '<p class="hint">Per consumer (or clientId): its consumption as a share of the production '
        "of the topics it reads; production is the topic's own figure, the same for every reader, "
        "and consumption is never summed over readers. Red: its lag grows beyond noise over the "
        "window (a consumer that keeps up reads at about 100 %, a little over or under from one "
        f"sample's timing to the next, and is not red).{chart_note}</p>"
        + img(png, "consumption of each consumer against the production of its topics")
        + table(["consumer / clientId", "topics", "lag", "trend", "consumed/s (this consumer)",
                 "produced/s (its topics)", "consumed ÷ produced", "time to drain"], rows, total,
                "consumers.csv", (2, 3, 4, 5, 6, 7), visible=25)
        + "</section>")


def _spread(rows: Sequence[Mapping[str, Any]], total: int) -> str:
    """' 350 queues of 45 consumers/clientIds; most: a (6), b (5), c (5).' for long lists."""
    if total <= 5:
        return ""
    from collections import Counter

    by = Counter((r["consumer"], r["client_id"]) for r in rows)
    most = ", ".join(f"{esc(c)}{'/' + esc(k) if k else ''} ({n})"
                     for (c, k), n in by.most_common(3))
    of = f"{len(by):,}" if len(rows) == total else f"{len(by):,}+"
    return f" {total:,} queues of {of} consumers/clientIds; the most: {most}."


def _day(iso: str) -> str:
    """'2024-05-01T23:30:00.000Z' -> '2024-05-01 23:30:00'."""
    return iso.replace("T", " ")[:19]


def _internal(i: Mapping[str, Any] | None) -> str:
    """' (internal ... left out)' in the header, unless they are included."""
    if not i or i.get("included"):
        return ""
    names = ", ".join(f"{p}*" for p in (*i["topic_prefixes"], *i["consumer_prefixes"]))
    return (f' <span title="the gateway\'s own topics and consumers ({esc(names)}); '
            f'--include-internal shows them">(internal ones left out)</span>')


def _gone(n: int) -> str:
    return f" ({n:,} gone before the last sample)" if n else ""


def _per_bucket(s: Mapping[str, Any], which: str) -> str:
    b = s["buckets"]
    if b[which] <= b["sample_interval_s"]:
        return ""
    return f" (the highest per {esc(duration(b[which]))})"


def human_int(v: int | None) -> str:
    if v is None:
        return "—"
    for div, unit in ((1e9, "G"), (1e6, "M")):
        if abs(v) >= div:
            return f"{v / div:.2f}{unit}"
    return f"{v:,}"


def _plain_trend(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{'+' if v > 0 else ''}{rate(v)}/s"


DEFINITIONS = """<section><h2>How the figures are computed</h2><dl>
<dt>Queue</dt><dd>One (consumer, clientId, broker, topic, partition). Its span runs from its first
to its last sample in the window, so a consumer that appears mid-window is measured over its own
span. A queue missing from the last sample (unregistered, or an expired clientId) is gone: it
counts in no current figure.</dd>
<dt>Lag</dt><dd>max offset − committed offset (at least 0), messages. Current lag = the last
sample's.</dd>
<dt>Trend</dt><dd>Least-squares slope of lag against time, messages/s. Beyond noise when its t
statistic (slope ÷ its standard error) is at least 3, over 3 samples or more.</dd>
<dt>Consumption rate</dt><dd>Sum of the increases of the committed offset between consecutive
samples ÷ span. An offset reset that moves it back counts 0 (never a negative rate).</dd>
<dt>Production rate</dt><dd>A property of the topic, the same for every reader: per partition,
the increase of its high watermark (the highest offset any sample listed for it) ÷ the
partition's span in the window; a topic's is the sum over its partitions, a consumer's the sum
over the partitions it reads. Consumption is per consumer and never summed over readers when set
against production.</dd>
<dt>Time to drain</dt><dd>From the lag's trend, not from two noisy rates. <b>never</b>: the lag
grows (a trend beyond noise that added more than one sample interval's production, more than
that is left, and consumption is not above production). <b>draining</b>: it shrinks beyond
noise, or it rose at a jump (an offset reset back) and consumption is above production; then
lag ÷ (consumption − production). <b>steady</b>: neither, e.g. a consumer keeping up, caught a
few messages behind at each sample. For a consumer or topic: never if any of its queues never
drains, else its slowest draining queue.</dd>
<dt>Stuck</dt><dd>Lag &gt; 0 while the committed offset stayed the same for more than {stuck},
measured up to the last sample; or the last sample's lock age exceeds the consume timeout.</dd>
<dt>Idle</dt><dd>No poll (<code>/message</code>, whatever it returned), lock or commit within
{idle} of the window's last sample.</dd>
</dl></section>"""
