"""From the job's result (tables and series) to the report's charts and the heat map's grid.

Kept apart from :mod:`gateway.reports.job` (Spark) and :mod:`gateway.reports.charts` (drawing):
this is where it is decided what each chart shows, and how many series it can carry legibly.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gateway.reports import buckets, rates
from gateway.reports.formatting import human

RATE_ROWS = 25  # consumers in the rates chart (behind first); the table under it has them all


def heat_grid(result: dict[str, Any]) -> tuple[list[str], list[list[float]]]:
    """Labels and rows of the heat map (one row per queue shown, one value per time bucket)."""
    first, step = result["first_ms"], result["heat_ms"]
    cols = result["span_ms"] // step + 1
    points: dict[tuple[str, ...], list[tuple[int, int, float]]] = {}
    for r in result["heat"]:
        k = tuple(r[c] for c in ("consumer", "client_id", "broker", "topic", "queue"))
        points.setdefault(k, []).append((r["t_ms"], r["last_ms"], r["lag"]))
    gap = buckets.max_gap_ms(result["interval_ms"])
    labels, grid = [], []
    for r in result["heat_rows"]:
        k = (r["consumer"], r["client_id"], r["broker"], r["topic"], r["queue"])
        labels.append(f"{rates.who(r)} · {r['topic']}[{r['queue']}]")
        grid.append(buckets.grid(points.get(k, []), first, step, cols, gap))
    return labels, grid


def heat_summary(result: dict[str, Any], grid: list[list[float]]) -> dict[str, Any]:
    """For summary.json: the heat map's size and the start of every column without a sample."""
    first, step = result["first_ms"], result["heat_ms"]
    empty = buckets.empty_columns(grid)
    return {"rows": len(grid), "columns": len(grid[0]) if grid else 0,
            "no_sample_columns": [_iso(first + c * step) for c in empty]}


def charts(result: dict[str, Any]) -> dict[str, Any]:
    """name -> :class:`gateway.reports.charts.Chart`, or None when there is nothing to draw."""
    from gateway.reports import charts as C

    t = result["tables"]
    out: dict[str, Any] = {}
    total = result["total"]
    out["total_lag"] = C.total_lag([r["t_ms"] for r in total], [r["lag"] for r in total],
                                   [r["queues_behind"] for r in total]) if total else None
    top = t["top"].to_pylist()
    series: dict[tuple[str, str], tuple[list[int], list[float]]] = {
        (r["consumer"], r["client_id"]): ([], []) for r in top}
    for r in result["top_series"]:
        xs, ys = series[(r["consumer"], r["client_id"])]
        xs.append(r["t_ms"])
        ys.append(r["lag"])
    panels = []
    for r in top:
        xs, ys = series[(r["consumer"], r["client_id"])]
        slope = r["lag_slope"] or 0.0
        note = f"{human(r['lag'])}" + (f" {'▲' if slope > 0 else '▼'} {human(abs(slope))}/s"
                                       if abs(slope) >= 0.005 else "")
        panels.append(C.Panel(f"{r['rank']}. {rates.who(r)}", note, rates.behind(r), xs, ys))
    out["top_lag"] = C.top_lag(panels) if panels else None
    readers = rates.topics_by_reader(result["readers"])
    shown = rates.ranked(t["consumers"].to_pylist())[:RATE_ROWS]
    out["rates"] = C.consumer_rates([
        C.RateRow(rates.who(r), rates.topics_text(readers.get((r["consumer"], r["client_id"]), [])),
                  r["consumption_rate"], r["production_rate"], r["lag"] or 0, rates.behind(r))
        for r in shown]) if shown else None
    if result["heat_rows"]:
        labels, grid = result["heat_grid"]
        out["heatmap"] = C.lag_heatmap(labels, result["first_ms"], result["heat_ms"], grid)
    else:
        out["heatmap"] = None
    return out


def layout(charts: dict[str, Any]) -> dict[str, Any]:
    """For summary.json: each chart's size and its labels' boxes (pixels, from the top left)."""
    return {name: {"size": list(c.size), "labels": [list(lb) for lb in c.labels]}
            for name, c in charts.items() if c is not None}


def _iso(ms: int) -> str:
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
