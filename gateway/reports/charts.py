"""PNG charts for the report (matplotlib, Agg backend, no pyplot state).

Each chart returns a :class:`Chart`: the PNG and where its labels landed, in pixels, so that a test
(and ``summary.json``) can tell that every series is named and that no two names overlap. Charts
that would carry more series than a reader can tell apart are drawn as small multiples (one panel
per series) or as one labelled row per series, never as a tangle of lines or a cloud of dots.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator

from gateway.reports.formatting import human, rate

DPI = 100
INK, MUTED, GRID = "#1f2937", "#6b7280", "#e5e7eb"
GOOD, BAD = "#16a34a", "#dc2626"
UTC = dt.UTC


_HUMAN = FuncFormatter(lambda v, _pos: human(v))


def _times(ms: Sequence[int]) -> Any:
    """Datetimes for an axis (Any: matplotlib plots them through its date converter, which its
    type stubs do not know)."""
    return [dt.datetime.fromtimestamp(t / 1000, UTC) for t in ms]


def _figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    fig.set_facecolor("white")
    return fig


def _style(ax: Axes, ylabel: str | None = None) -> None:
    ax.grid(True, color=GRID, linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color("#9ca3af")
    ax.tick_params(colors=INK, labelsize=10)
    if ylabel:
        ax.set_ylabel(ylabel, color=MUTED, fontsize=10)


# matplotlib.dates leaves these unannotated: the untyped calls are here and only here.

def _time_axis(ax: Axes, minticks: int = 4, maxticks: int = 10, show_offset: bool = True) -> None:
    """UTC dates on the x axis, in as few characters as tell them apart."""
    loc = mdates.AutoDateLocator(tz=UTC, minticks=minticks, maxticks=maxticks)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(loc)
    ax.xaxis.set_major_formatter(
        mdates.ConciseDateFormatter(loc, tz=UTC, show_offset=show_offset))  # type: ignore[no-untyped-call]


def _date_num(ms: int) -> float:
    """Epoch ms as matplotlib's date number (for an image's extent)."""
    n: float = mdates.date2num(dt.datetime.fromtimestamp(ms / 1000, UTC))  # type: ignore[no-untyped-call]
    return n


#: A label as drawn: its text and box (x0, y0, x1, y1) in pixels from the image's top left.
Label = tuple[str, float, float, float, float]


@dataclass(frozen=True)
class Chart:
    """A rendered chart: PNG bytes, its size in pixels and the boxes of its series labels."""

    png: bytes
    size: tuple[int, int]
    labels: list[Label] = field(default_factory=list)


def _render(fig: Figure, texts: Sequence[Text] = (), ticks_of: Any = None) -> Chart:
    """Draw once (constrained layout settles), measure the labels (``texts`` and the y tick labels
    of the axes ``ticks_of``, read after drawing, which may replace them), then write the PNG."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]  # matplotlib's backend_agg is unannotated
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    height = fig.bbox.height
    labels: list[Label] = []
    ticks = list(ticks_of.get_yticklabels()) if ticks_of is not None else []
    for t in [*ticks, *texts]:
        if not t.get_visible() or not t.get_text():
            continue
        b = t.get_window_extent(renderer)
        labels.append((t.get_text(), round(float(b.x0), 1), round(float(height - b.y1), 1),
                       round(float(b.x1), 1), round(float(height - b.y0), 1)))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return Chart(buf.getvalue(), (round(fig.bbox.width), round(height)), labels)


def total_lag(t_ms: Sequence[int], lag: Sequence[float], behind: Sequence[int]) -> Chart:
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
    return _render(fig)


class Panel(NamedTuple):
    """One consumer's panel in :func:`top_lag`."""

    title: str  # "1. consumer-a / client"
    note: str  # "31.7k ▲ +1.55/s": lag now and its trend
    growing: bool  # its lag grows beyond noise (drain status "never"): drawn red
    t_ms: Sequence[int]
    lag: Sequence[float]


PANEL_COLUMNS = 4
TITLE_CHARS = 30  # a panel's title is cut to this (the table under the chart has full names)


def top_lag(panels: Sequence[Panel]) -> Chart:
    """Small multiples: lag over time, one panel per consumer in ranking order, each on its own
    scale (one line per consumer on a shared axis put 7 of 9 lines on top of each other) and named
    above its panel with its current lag and trend."""
    n = len(panels)
    ncols = min(PANEL_COLUMNS, n)
    nrows = math.ceil(n / ncols)
    fig = _figure(12, 1.7 * nrows + 0.3)
    axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False).ravel()
    texts: list[Text] = []
    for i, ax in enumerate(axes):
        if i >= n:
            ax.set_visible(False)
            if i - ncols >= 0:  # the panel above ends its column: it shows the time axis
                axes[i - ncols].xaxis.set_tick_params(labelbottom=True)
            continue
        p = panels[i]
        x = _times(p.t_ms)
        color = BAD if p.growing else "#2563eb"
        ax.fill_between(x, p.lag, color=color, alpha=0.14, linewidth=0)
        ax.plot(x, p.lag, color=color, linewidth=1.6, marker="o" if len(x) < 3 else None,
                markersize=3)
        _style(ax)
        ax.tick_params(labelsize=8)
        ax.yaxis.set_major_locator(MaxNLocator(3))
        ax.yaxis.set_major_formatter(_HUMAN)
        ax.set_ylim(bottom=0)
        # the name, and under it the lag now and its trend: stacked, so a long name never runs
        # into the figures (side by side they collided in a 300 px panel)
        texts.append(ax.set_title(_short(p.title, TITLE_CHARS), loc="left", fontsize=9.5,
                                  fontweight="bold", color=INK, pad=18))
        texts.append(ax.annotate(p.note, (0, 1), xycoords="axes fraction", xytext=(0, 3),
                                 textcoords="offset points", va="bottom", ha="left", fontsize=9,
                                 color=BAD if p.growing else GOOD))
    # shared: one locator and formatter for every panel
    _time_axis(axes[0], minticks=2, maxticks=4, show_offset=False)
    return _render(fig, texts)


class RateRow(NamedTuple):
    """One consumer in :func:`consumer_rates`."""

    name: str  # "consumer-a / client"
    topics: str  # "orders" or "orders +2"
    consumed: float | None  # messages/s, this consumer
    produced: float | None  # messages/s, the topics (partitions) it reads
    lag: int
    behind: bool = False  # its lag grows (gateway.reports.rates.behind): drawn red


RATE_CAP = 2.0  # the ratio axis ends at 200%: "far faster than production" needs no more


def consumer_rates(rows: Sequence[RateRow]) -> Chart:
    """One labelled row per consumer: its consumption as a share of the production of the topics
    it reads (100% = keeps up), red when its lag grows, with both rates written out.

    A ratio, not two bars on one axis: rates from 0.1/s to 10,000/s side by side left every small
    consumer as an unreadable dot at zero."""
    n = len(rows)
    fig = _figure(12, 0.3 * n + 1.25)
    ax = fig.subplots()
    ys = list(range(n))[::-1]  # the first row on top
    ratios, colors, notes = [], [], []
    for r in rows:
        c, p = r.consumed or 0.0, r.produced or 0.0
        ratio = (c / p) if p > 0 else (RATE_CAP if c > 0 else 1.0)
        ratios.append(min(ratio, RATE_CAP))
        colors.append(BAD if r.behind else GOOD)
        notes.append(f"{rate(r.consumed)} of {rate(r.produced)}/s"
                     + (f" · lag {human(r.lag)}" if r.lag else ""))
    ax.barh(ys, ratios, height=0.62, color=colors, zorder=2)
    ax.axvline(1.0, color=INK, linewidth=1.2, zorder=3)
    ax.set_xlim(0, RATE_CAP * 1.02)
    ax.xaxis.set_major_locator(FixedLocator([0, 0.5, 1.0, 1.5, 2.0]))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _pos: "≥ 200%" if v >= RATE_CAP else f"{v:.0%}"))
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_yticks(ys, [_short(f"{r.name} · {r.topics}", 46) for r in rows], fontsize=9)
    texts: list[Text] = []
    for y, note, color in zip(ys, notes, colors, strict=True):
        # right of the plot, in a column of their own: never on a bar, never on each other
        texts.append(ax.annotate(note, (1.0, y), xycoords=("axes fraction", "data"),
                                 xytext=(6, 0), textcoords="offset points", va="center",
                                 fontsize=8.5, color=INK if color == GOOD else BAD))
    _style(ax)
    ax.grid(False, axis="y")
    ax.set_xlabel("consumed ÷ produced: this consumer's rate ÷ the production of the topics it "
                  "reads (100% keeps up)", color=MUTED, fontsize=9.5)
    ax.text(1.0, n - 0.4, " = production", color=INK, fontsize=8, va="bottom", ha="left")
    return _render(fig, texts, ticks_of=ax)


def lag_heatmap(labels: Sequence[str], start_ms: int, bucket_ms: int,
                grid: Sequence[Sequence[float]]) -> Chart:
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
    x0, x1 = _date_num(start_ms), _date_num(start_ms + cols * bucket_ms)
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
    return _render(fig, ticks_of=ax)


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
