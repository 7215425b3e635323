"""The self-contained HTML report: inline CSS (report.css), PNG charts as base64 data URIs, no
external assets.

Order is what an operator needs first: headline numbers, then the stuck queues, then where the
lag is (total, top consumers, each consumer against its topics, topics, heat map), then idle
consumers, then the definitions: :func:`page` strings those sections together, one function
each. The cells and tables they are made of are :mod:`gateway.reports.cells`', the figures' text
:mod:`gateway.reports.formatting`'s.
(Not called ``html.py``: spark-submit puts this directory first on sys.path, where that name
would shadow the standard library's ``html``.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from gateway.reports import rates
from gateway.reports.cells import ROW_LIMIT, card, drain, esc, img, table, topic, trend, who
from gateway.reports.figures import RATE_ROWS
from gateway.reports.formatting import day, duration, human_int, num, plain_trend, rate, when
from gateway.reports.rates import Row

#: The page's style sheet, inlined into every page.
CSS = resources.files("gateway.reports").joinpath("report.css").read_text(encoding="utf-8")

def page(s: Mapping[str, Any], t: Mapping[str, Sequence[Row]],
         charts: Mapping[str, bytes | None]) -> str:
    """The report page from the summary ``s``, the tables ``t`` (lists of row dicts) and charts."""
    consumers, readers = t.get("consumers", []), t.get("readers", [])
    return "\n".join([
        *_head(s),
        *_cards(s, consumers),
        _stuck_section(s, t["stuck"]),
        _total_section(s, charts.get("total_lag")),
        _top_section(t["top"], charts.get("top_lag")),
        _rates_section(consumers, readers, s["counts"]["consumers"], charts.get("rates")),
        _topics_section(t["topics"], readers),
        _heatmap_section(s, charts.get("heatmap")),
        _idle_section(s, t["idle"]),
        DEFINITIONS.format(stuck=esc(duration(s["thresholds"]["stuck_after_s"])),
                           idle=esc(duration(s["thresholds"]["idle_after_s"]))),
        _foot(s),
    ])


def _head(s: Mapping[str, Any]) -> list[str]:
    """The document head and the page header: the window and what it holds."""
    w, c = s["window"], s["counts"]
    return [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>Lag report {esc(w['first_sample'])} – {esc(w['last_sample'])}</title>",
        f"<style>\n{CSS}</style></head><body>",
        "<header><h1>mq-gateway · consumer lag report</h1>",
        f'<div class="meta">{esc(day(w["first_sample"]))} → {esc(day(w["last_sample"]))} UTC '
        f'({esc(duration(w["span_s"]))}) · {c["samples"]:,} samples · '
        f'{c["rows"]:,} rows · {c["consumers"]:,} consumers/clientIds · '
        f'{c["queues"]:,} queues{_gone(c.get("gone", 0))} · '
        f'{c["topics"]:,} topics{_internal(s.get("internal"))} · '
        f'generated {esc(s["generated_at"])}</div></header><main>',
    ]


def _cards(s: Mapping[str, Any], consumers: Sequence[Row]) -> list[str]:
    """The headline numbers, coloured by whether they need a look."""
    tot, th, c = s["totals"], s["thresholds"], s["counts"]
    n_stuck, n_idle, n_never = c["stuck"], c["idle"], c["never"]
    return [
        '<div class="cards">',
        card("Stuck queues", f"{n_stuck:,}",
             f"no progress &gt; {esc(duration(th['stuck_after_s']))} or lock expired",
             "red" if n_stuck else "green"),
        card("Total lag", human_int(tot["lag"]),
             f"messages · trend {plain_trend(tot['lag_slope'])}",
             "amber" if (tot["lag_slope"] or 0) > 0 else "blue"),
        card("Never draining", f"{n_never:,}", "queues whose lag grows beyond noise",
             "amber" if n_never else "green"),
        card("Idle", f"{n_idle:,}",
             f"consumers/clientIds, not seen in {esc(duration(th['idle_after_s']))}",
             "amber" if n_idle else "green"),
        card("Produced · per topic", f'{rate(tot["production_rate"])}<small>/s</small>',
             f'into {c["topics"]:,} topics, each topic counted once', "blue"),
        _behind_card([r for r in consumers if rates.behind(r)], len(consumers)),
        "</div>",
    ]


def _stuck_section(s: Mapping[str, Any], stuck: Sequence[Row]) -> str:
    """1. The stuck queues, longest stall first, or a green all-clear."""
    if not stuck:
        return ('<section class="ok"><h2>Stuck queues</h2><p class="empty">None: every queue '
                'with a backlog made progress, and no lock outlived its timeout.</p></section>')
    n_stuck, after = s["counts"]["stuck"], s["thresholds"]["stuck_after_s"]
    rows = [[who(r), topic(r), esc(r["queue"]), _stuck_why(r), num(r["lag"]),
             num(r["committed_offset"]), rate(r["consumption_rate"]),
             rate(r["production_rate"])]
            for r in stuck[:ROW_LIMIT]]
    return (
        f'<section class="alert"><h2>Stuck queues ({n_stuck:,})</h2>'
        f'<p class="hint">A backlog whose committed offset has not moved for more than '
        f'{esc(duration(after))}, or a lock held past its consume timeout, in '
        f'the last sample. Longest stall first.{_spread(stuck, n_stuck)}</p>'
        + table(["consumer / clientId", "topic", "queue", "why", "lag", "committed",
                 "consumed/s", "produced/s"], rows, n_stuck, "stuck.csv", (4, 5, 6, 7))
        + "</section>")


def _stuck_why(r: Row) -> str:
    """Why a queue is stuck: no progress for how long, a lock held past its timeout, paused."""
    parts = []
    if r.get("reason", "").find("no progress") >= 0:
        parts.append(f'<span class="pill red">no progress {esc(duration(r["stalled_s"]))}</span>')
    if r.get("reason", "").find("lock expired") >= 0:
        parts.append(f'<span class="pill amber">lock held {esc(duration(r["lock_age_ms"] / 1000))}'
                     f' &gt; timeout {esc(duration(r["lock_timeout_ms"] / 1000))}</span>')
    if r.get("paused"):
        parts.append('<span class="pill grey">paused</span>')
    return " ".join(parts)



def _total_section(s: Mapping[str, Any], png: bytes | None) -> str:
    """2. The total lag over time."""
    return ('<section><h2>Total lag over time</h2><p class="hint">Sum of the lag of every '
            f'queue at each sample{_per_bucket(s, "line_s")}, and how many queues had any '
            'lag.</p>'
            + img(png, "total lag over time") + "</section>")


def _top_section(top: Sequence[Row], png: bytes | None) -> str:
    """3. The consumers with the most lag: a panel each, and a table."""
    rows = [[str(r["rank"]), who(r), esc(r["mode"]), num(r["lag"]),
             trend(r["lag_slope"], r["drain_status"]),
             rate(r["consumption_rate"]), rate(r["production_rate"]),
             drain(r["drain_status"], r["drain_s"]), num(r["stuck_queues"])] for r in top]
    return (
        f'<section><h2>Top {len(top) or ""} consumers by lag</h2>'
        '<p class="hint">One panel per consumer (or clientId), each on its own scale: lag summed '
        "over its queues, its current lag and trend above it (least-squares slope over the "
        "window: ▲ up, ▼ down; red or green only beyond noise). Time to drain = lag ÷ "
        "(consumption − production); never where the lag grows, steady where it neither grows "
        "nor shrinks beyond noise.</p>"
        + img(png, "lag over time of the top consumers")
        + (table(["#", "consumer / clientId", "mode", "lag", "trend", "consumed/s (this consumer)",
                  "produced/s (its topics)", "time to drain", "stuck"], rows, len(rows),
                 "top.csv", (0, 3, 4, 5, 6, 7, 8))
           if rows else '<p class="empty">No consumer has any lag.</p>')
        + "</section>")


def _behind_card(slow: Sequence[Row], n: int) -> str:
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


def _slowest(r: Row | None) -> str:
    if r is None:
        return "—"
    cls = "bad" if rates.behind(r) else ""
    return (f'<span class="{cls}">{rate(r["consumption_rate"])}</span> '
            f'<span class="muted">{esc(rates.who(r))}</span>')


def _rates_section(consumers: Sequence[Row], readers: Sequence[Row],
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


def _topics_section(topics: Sequence[Row], readers: Sequence[Row]) -> str:
    """5. The topics: the topic's own production, and its slowest reader."""
    slowest = rates.slowest_readers(readers)
    rows = [[topic(r), num(r["partitions"]), num(r["subscriptions"]), num(r["lag"]),
             trend(r["lag_slope"], r.get("drain_status")), rate(r["production_rate"]),
             _slowest(slowest.get((r["broker"], r["topic"]))), num(r["stuck_queues"])]
            for r in topics[:ROW_LIMIT]]
    return (
        '<section><h2>Topics</h2><p class="hint">Produced/s is the topic\'s own figure (from its '
        "partitions' high watermarks over the window), the same for every reader. Lag and trend "
        "are summed over its readers; consumption is not (a sum over readers says nothing about "
        "any one of them): the slowest reader is named instead. Most lag first.</p>"
        + table(["topic", "partitions", "readers", "lag (all readers)", "trend",
                 "produced/s (per topic)", "slowest reader: consumed/s", "stuck"], rows,
                len(topics), "topics.csv", (1, 2, 3, 4, 5, 6, 7))
        + "</section>")


def _heatmap_section(s: Mapping[str, Any], png: bytes | None) -> str:
    """6. The queues with the most lag, over time."""
    b = s["buckets"]
    return (
        f'<section><h2>Queues by lag over time</h2><p class="hint">The {s["heatmap"]["rows"]} '
        "queues with the most lag now, most first; each cell is the highest lag in "
        f'{esc(duration(b["heat_s"]))} (white: no lag; grey: no sample for more than '
        f'{esc(duration(1.5 * b["sample_interval_s"]))}, 1.5 sample intervals: the '
        "snapshots stopped, or the queue did not exist yet).</p>"
        + img(png, "heat map of queues by lag") + "</section>")


def _idle_section(s: Mapping[str, Any], idle: Sequence[Row]) -> str:
    """7. The idle consumers and clientIds, or a green all-clear."""
    after = esc(duration(s["thresholds"]["idle_after_s"]))
    if not idle:
        return ('<section class="ok"><h2>Idle consumers and clientIds</h2><p class="empty">'
                f'None: every consumer was active within {after}.'
                "</p></section>")
    n_idle = s["counts"]["idle"]
    rows = [[esc(r["kind"]), who(r), esc(r["mode"]), esc(when(r["last_seen_ms"])),
             esc(duration(r["idle_s"]) if r["idle_s"] is not None else "never seen"),
             num(r["lag"])] for r in idle[:ROW_LIMIT]]
    return (
        f'<section><h2>Idle consumers and clientIds ({n_idle:,})</h2><p class="hint">No '
        f'poll, lock or commit within {after} of the last sample.</p>'
        + table(["kind", "consumer / clientId", "mode", "last seen (UTC)", "idle for", "lag"],
                rows, n_idle, "idle.csv", (4, 5)) + "</section>")


def _foot(s: Mapping[str, Any]) -> str:
    return (f'</main><footer>Tables: queues, consumers, topics, stuck, idle, top (.parquet and '
            f'.csv) next to this file · Spark {esc(s["spark"]["version"])} on '
            f'{esc(s["spark"]["master"])} · {s["elapsed_s"]:.1f} s</footer></body></html>')


def _spread(rows: Sequence[Row], total: int) -> str:
    """' 350 queues of 45 consumers/clientIds; most: a (6), b (5), c (5).' for long lists."""
    if total <= 5:
        return ""
    from collections import Counter

    by = Counter((r["consumer"], r["client_id"]) for r in rows)
    most = ", ".join(f"{esc(c)}{'/' + esc(k) if k else ''} ({n})"
                     for (c, k), n in by.most_common(3))
    of = f"{len(by):,}" if len(rows) == total else f"{len(by):,}+"
    return f" {total:,} queues of {of} consumers/clientIds; the most: {most}."


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
