"""PNG charts for the report (matplotlib, Agg backend, no pyplot state). Each returns PNG bytes."""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates
from matplotlib import colormaps
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

DPI = 100
INK, MUTED, GRID = "#1f2937", "#6b7280", "#e5e7eb"
GOOD, BAD, PROD = "#16a34a", "#dc2626", "#94a3b8"
UTC = dt.UTC


def human(v: float) -> str:
    """12 -> '12', 12_345 -> '12.3k', 4_200_000 -> '4.2M'."""
    a = abs(v)
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            s = f"{v / div:.1f}".rstrip("0").rstrip(".")
            return s + unit
    return f"{v:.0f}" if a >= 10 or v == int(v) else f"{v:.2g}"


_HUMAN = FuncFormatter(lambda v, _pos: human(v))


def _times(ms: Sequence[int]) -> Any:
    """Datetimes for an axis (Any: matplotlib plots them through its date converter, which its
    type stubs do not know)."""
    return [dt.datetime.fromtimestamp(t / 1000, UTC) for t in ms]


def _figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    fig.set_facecolor("white")
    return fig


def _style(ax, ylabel: str | None = None) -> None:
    ax.grid(True, color=GRID, linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color("#9ca3af")
    ax.tick_params(colors=INK, labelsize=10)
    if ylabel:
        ax.set_ylabel(ylabel, color=MUTED, fontsize=10)


def _time_axis(ax) -> None:
    loc = mdates.AutoDateLocator(tz=UTC, minticks=4, maxticks=10)
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc, tz=UTC))


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def total_lag(t_ms: Sequence[int], lag: Sequence[float], behind: Sequence[int]) -> bytes:
    """Total lag over time (area), with the number of queues behind on a second axis."""
    fig = _figure(12, 3.0)
    ax = fig.subplots()
    x = _times(t_ms)
    ax.fill_between(x, lag, color="#fecaca", step="post" if len(x) < 3 else None)
    ax.plot(x, lag, color=BAD, linewidth=1.8, label="total lag")
    _style(ax, "messages")
    ax.yaxis.set_major_formatter(_HUMAN)
    ax.set_ylim(bottom=0)
    _time_axis(ax)
    ax2 = ax.twinx()
    ax2.plot(x, behind, color="#2563eb", linewidth=1.2, linestyle="--", label="queues with lag")
    ax2.set_ylim(bottom=0)
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.tick_params(colors="#2563eb", labelsize=9)
    ax2.set_ylabel("queues with lag > 0", color="#2563eb", fontsize=10)
    for side in ("top", "left", "bottom"):
        ax2.spines[side].set_visible(False)
    ax2.spines["right"].set_color("#93c5fd")
    lines = ax.get_lines() + ax2.get_lines()
    ax.legend(lines, [str(ln.get_label()) for ln in lines], loc="lower left", bbox_to_anchor=(0, 1.0),
              ncol=2, frameon=False, fontsize=9, borderaxespad=0.2)
    return _png(fig)


def top_lag(series: Mapping[str, tuple[Sequence[int], Sequence[float]]]) -> bytes:
    """Lag over time, one line per consumer (label -> (t_ms, lag)), in ranking order."""
    fig = _figure(12, 4.6)
    ax = fig.subplots()
    colors: Sequence[Any] = cast(Sequence[Any], cast(ListedColormap, colormaps["tab10"]).colors)
    for i, (label, (t, lag)) in enumerate(series.items()):
        ax.plot(_times(t), lag, color=colors[i % len(colors)], linewidth=1.8,
                marker="o" if len(t) < 3 else None, label=f"{i + 1}. {label}")
    _style(ax, "lag (messages)")
    ax.yaxis.set_major_formatter(_HUMAN)
    ax.set_ylim(bottom=0)
    _time_axis(ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9,
              title="rank. consumer", title_fontsize=9, alignment="left")
    return _png(fig)


def topic_rates(topics: Sequence[Mapping], readers: Mapping[tuple[str, str], Sequence[Mapping]],
                unit: str = "messages/s") -> bytes:
    """Per topic: the production rate (bar) and each reader's consumption rate (dot: green when
    it consumes at least as fast as the partitions it reads are produced, red when slower)."""
    n = len(topics)
    fig = _figure(12, max(2.2, 0.55 * n + 1.3))
    ax = fig.subplots()
    labels = [t["topic"] if t.get("broker") in (None, "", "kafka")
              else f"{t['broker']}:{t['topic']}" for t in topics]
    ys = list(range(n))[::-1]  # the first topic on top
    prods = [t["production_rate"] or 0.0 for t in topics]
    ax.barh(ys, prods, height=0.6, color=PROD, zorder=2)
    top = max([*prods, 0.0])
    for y, t in zip(ys, topics, strict=True):
        rs = readers.get((t["broker"], t["topic"]), [])
        cs = [r["consumption_rate"] or 0.0 for r in rs]
        top = max([top, *cs])
        ax.scatter(cs, [y] * len(cs), s=46, zorder=3, edgecolors="white", linewidths=0.8,
                   c=[GOOD if _keeps_up(r) else BAD for r in rs])
        slow = sorted((r for r in rs if not _keeps_up(r)), key=lambda r: -(r.get("lag") or 0))
        for r in slow[:1]:  # name the reader that falls behind with the most lag
            name = r["consumer"] + (f"/{r['client_id']}" if r.get("client_id") else "")
            # from the dot rightwards: centred, a name near zero ran into the axis
            ax.annotate(_short(name, 28), (r["consumption_rate"] or 0.0, y), xytext=(-4, -13),
                        textcoords="offset points", ha="left", fontsize=7.5, color=BAD)
    for y, p in zip(ys, prods, strict=True):
        ax.text(p + top * 0.01, y + 0.32, f"{human(p)}/s produced", fontsize=8, color=MUTED,
                va="center")
    ax.set_yticks(ys, labels)
    ax.set_xlim(0, top * 1.18 if top > 0 else 1)
    _style(ax)
    ax.grid(False, axis="y")
    ax.set_xlabel(unit, color=MUTED, fontsize=10)
    ax.xaxis.set_major_formatter(_HUMAN)
    ax.legend(handles=[
        Patch(color=PROD, label="production rate"),
        Line2D([], [], marker="o", linestyle="", color=GOOD, label="a reader keeping up"),
        Line2D([], [], marker="o", linestyle="", color=BAD,
               label="a reader with lag, slower than its partitions are produced"),
    ], loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False, fontsize=9,
        borderaxespad=0.3)  # above the plot: inside, it hid the bottom bars' labels
    return _png(fig)


def lag_heatmap(labels: Sequence[str], start_ms: int, bucket_ms: int,
                grid: Sequence[Sequence[float]]) -> bytes:
    """Queues (rows, highest current lag first) x time buckets; colour = highest lag in the
    bucket on a log scale; white = no lag, grey = no sample."""
    import numpy as np

    m = np.array(grid, dtype=float)
    rows, cols = m.shape
    fig = _figure(12, max(2.4, 0.27 * rows + 1.4))
    ax = fig.subplots()
    finite = m[np.isfinite(m)]
    vmax = max(2.0, float(finite.max()) if finite.size else 2.0)
    cmap = colormaps["YlOrRd"].with_extremes(under="white", bad="#e5e7eb")
    shown = np.where(m == 0, 0.5, m)  # under vmin -> white
    x0 = mdates.date2num(dt.datetime.fromtimestamp(start_ms / 1000, UTC))
    x1 = mdates.date2num(dt.datetime.fromtimestamp((start_ms + cols * bucket_ms) / 1000, UTC))
    im = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", interpolation="nearest",
                   cmap=cmap, norm=LogNorm(vmin=1, vmax=vmax), extent=(x0, x1, rows, 0))
    ax.set_yticks([i + 0.5 for i in range(rows)], [_short(s, 52) for s in labels], fontsize=8)
    ax.xaxis_date(tz=UTC)
    _time_axis(ax)
    ax.tick_params(axis="x", labelsize=9, colors=INK)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    cb = fig.colorbar(im, ax=ax, pad=0.01, fraction=0.03, extend="min")
    cb.set_label("lag (messages, log scale)", color=MUTED, fontsize=9)
    cb.ax.yaxis.set_major_formatter(_HUMAN)
    cb.ax.tick_params(labelsize=8)
    return _png(fig)


def _keeps_up(r: Mapping) -> bool:
    c, p = r.get("consumption_rate"), r.get("production_rate")
    if c is None or p is None:
        return not r.get("lag")
    return c >= p * (1 - 1e-9) or not r.get("lag")


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def bucket_grid(series: Sequence[tuple[int, float]], start_ms: int, bucket_ms: int,
                cols: int) -> list[float]:
    """(t_ms, lag) points -> one value per bucket (NaN where the bucket has no sample)."""
    row = [math.nan] * cols
    for t, v in series:
        i = (t - start_ms) // bucket_ms
        if 0 <= i < cols:
            row[i] = v if math.isnan(row[i]) else max(row[i], v)
    return row
