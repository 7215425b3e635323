"""What an operator reads at a glance in ``mqgw report``'s page (issue 13).

- The heat map shows "no sample" only where the snapshots really stopped, not where a few
  milliseconds of jitter moved a sample across a bucket boundary.
- Production is a property of the topic: every reader of a topic shows the same figure, and each
  consumer is set against it, never a sum of consumption over readers.
- The top-N and rates charts stay legible at 200 consumers: every series has its own label, and
  no two labels overlap (measured where matplotlib drew them).
- A local run prints no "hostname resolves to a loopback address" warning.

The fast tests check the pieces in Python; the slow ones run the real job (``local[2]``) on
synthetic snapshots, without SPARK_LOCAL_IP in the environment, as an operator would.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import random
import re
import statistics
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gateway.core.snapshot_format import to_ms
from gateway.reports import buckets, charts, rates, synth

from ..support.report import assert_renders, run_report, spark_env, table_rows

STEP_MS = 60_000
START = dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)
T0 = to_ms(START)
LOOPBACK_WARNING = "resolves to a loopback address"


def _jittered(n: int, jitter_ms: int, seed: int, skip: range = range(0)) -> list[int]:
    """Sample times every 60 s from T0, each moved by up to ``jitter_ms`` either way."""
    rnd = random.Random(seed)
    return [T0 + k * STEP_MS + rnd.randint(-jitter_ms, jitter_ms) for k in range(n)
            if k not in skip]


def _spark_buckets(times: list[int], start: int, step: int) -> list[tuple[int, int, float]]:
    """What lag._bucketed returns for one queue: (first, last, lag) per bucket."""
    by: dict[int, list[int]] = {}
    for t in times:
        by.setdefault((t - start) // step, []).append(t)
    return [(min(ts), max(ts), 1.0) for _, ts in sorted(by.items())]


def _overlaps(labels: list[list]) -> list[tuple[str, str]]:
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]:
                out.append((a[0], b[0]))
    return out


# -- the heat map's buckets ------------------------------------------------------------------------

def test_jitter_never_shows_a_gap() -> None:
    """20 minutes of 60 s ± 300 ms snapshots: several buckets get two samples and their
    neighbours none, yet no cell is "no sample"."""
    unfilled = 0
    for seed in range(20):
        times = _jittered(21, 300, seed)
        step = int(statistics.median(b - a for a, b in itertools.pairwise(times)))
        cols = (times[-1] - times[0]) // step + 1
        pts = _spark_buckets(times, times[0], step)
        unfilled += cols - len(pts)
        row = buckets.grid(pts, times[0], step, cols, buckets.max_gap_ms(step))
        assert not any(math.isnan(v) for v in row), (seed, row)
    assert unfilled > 0  # buckets without a sample of their own: these were the grey columns


def test_a_real_hole_stays_grey() -> None:
    """Snapshots stopped for 5 samples: the buckets inside the hole have no sample, the rest do."""
    times = _jittered(36, 300, 3, skip=range(15, 20))
    step = STEP_MS
    cols = (times[-1] - times[0]) // step + 1
    row = buckets.grid(_spark_buckets(times, times[0], step), times[0], step, cols,
                       buckets.max_gap_ms(step))
    empty = [i for i, v in enumerate(row) if math.isnan(v)]
    before, after = times[14], times[15]  # the samples either side of the hole
    inside = [c for c in range(cols)
              if times[0] + c * step >= before and times[0] + (c + 1) * step <= after]
    assert len(inside) >= 4 and set(inside) <= set(empty)
    for c in empty:  # and nothing grey outside the hole
        assert times[0] + (c + 1) * step > before and times[0] + c * step < after, c
    assert buckets.empty_columns([row, [0.0] * cols]) == []
    assert buckets.empty_columns([row, row]) == empty


# -- per consumer against per topic ----------------------------------------------------------------

def test_behind_and_slowest_reader() -> None:
    # behind: the lag grows (the job's drain_status), whatever the two rates say on their own
    a = {"consumer": "a", "client_id": "", "broker": "kafka", "topic": "t", "lag": 10,
         "consumption_rate": 2.1, "production_rate": 3.0, "drain_status": "never"}
    b = dict(a, consumer="b", consumption_rate=2.1 * 2,  # a sum over both would look fine
             drain_status="draining")
    idle = dict(a, consumer="c", lag=0, consumption_rate=0.0, drain_status="drained")
    assert rates.behind(a) and not rates.behind(b) and not rates.behind(idle)
    assert [r["consumer"] for r in rates.ranked([b, idle, a])] == ["a", "b", "c"]
    assert rates.slowest_readers([b, a, idle])[("kafka", "t")]["consumer"] == "c"
    assert rates.topics_text(["x", "y", "z"]) == "x +2"


# -- legibility of the charts ----------------------------------------------------------------------

def test_top_lag_panels_are_all_labelled_apart() -> None:
    """Ten consumers with almost the same lag (one line each on a shared axis would lie on top of
    each other): one panel each, every name and figure drawn, none overlapping."""
    t = [T0 + k * STEP_MS for k in range(21)]
    panels = [charts.Panel(f"{i + 1}. consumer-with-a-long-name-{i:05d} / host-{i % 3}",
                           f"{30 - i}k ▲ 1.2/s", True, t, [30_000 - i * 10 + k for k in range(21)])
              for i in range(10)]
    c = charts.top_lag(panels)
    assert len(c.labels) == 20
    assert not _overlaps([list(lb) for lb in c.labels])
    w, h = c.size
    assert all(0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h for _, x0, y0, x1, y1 in c.labels)


def test_rates_rows_are_all_labelled_apart() -> None:
    rows = [charts.RateRow(f"consumer-{i:05d} / host-{i % 3}", "topic-with-a-long-name +2",
                           1.0 + i, 2.0 + i * 0.5, 10_000 - i) for i in range(25)]
    c = charts.consumer_rates(rows)
    names = [lb for lb in c.labels if lb[0].startswith("consumer-")]
    notes = [lb for lb in c.labels if "/s" in lb[0]]
    assert len(names) == 25 and len(notes) == 25
    assert not _overlaps([list(lb) for lb in c.labels])


# -- the real job ----------------------------------------------------------------------------------

def _report(snaps: Path, out: Path) -> subprocess.CompletedProcess:
    env = spark_env()
    env.pop("SPARK_LOCAL_IP", None)  # as an operator runs it
    return run_report(snaps, out, "--conf", "spark.sql.shuffle.partitions=4", env=env, timeout=280)


@pytest.fixture(scope="module")
def report_200(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    snaps = tmp_path_factory.mktemp("snaps200")
    synth.generate(snaps, consumers=200, queues=4, samples=21, interval_s=60.0, topics=40,
                   jitter_s=0.3, start=START)
    out = tmp_path_factory.mktemp("report200")
    return out, _report(snaps, out)


def _hole_rows(k: int, t: int) -> list[dict]:
    """Topic t (2 partitions) gets 1 msg/s per partition for 15 minutes, then 5 msg/s. Consumer
    a is in every sample and falls behind; b (created later) is only in the samples from 21 on,
    and drains."""
    rows = []
    for q in ("0", "1"):
        hw = 1000 + 60 * min(k, 15) + 300 * max(k - 15, 0)
        rows.append({"consumer": "a", "topic": "t", "queue": q, "max_offset": hw,
                     "high_watermark": hw, "committed_offset": 1000 + 50 * k,
                     "last_access_ms": t, "registered": True})
        if k >= 21:
            rows.append({"consumer": "b", "topic": "t", "queue": q, "max_offset": hw,
                         "high_watermark": hw, "committed_offset": hw - 500 + 10 * (k - 21),
                         "last_access_ms": t, "registered": True})
    return rows


HOLE = range(15, 20)  # samples the snapshotter did not take: 10:15 - 10:19


@pytest.fixture(scope="module")
def report_hole(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, list[int]]:
    snaps = tmp_path_factory.mktemp("snapshole")
    rnd = random.Random(11)
    times = []
    for k in range(36):
        t = T0 + k * STEP_MS + rnd.randint(-400, 400)
        if k in HOLE:
            continue
        times.append(t)
        synth.write_sample(synth.table_from_rows(t, _hole_rows(k, t)), snaps, t)
    out = tmp_path_factory.mktemp("reporthole")
    return out, _report(snaps, out), times


@pytest.mark.slow  # Spark
@pytest.mark.timeout(300)
def test_local_run_prints_no_loopback_warning(report_200, report_hole) -> None:
    for _, p, *_ in (report_200, report_hole):
        assert LOOPBACK_WARNING not in p.stderr, p.stderr[-3000:]
        assert "SPARK_LOCAL_IP" not in p.stderr, p.stderr[-3000:]


@pytest.mark.slow  # Spark
@pytest.mark.timeout(300)
def test_200_consumers_jittered_no_gap_and_legible(report_200) -> None:
    out, _ = report_200
    s = json.loads((out / "summary.json").read_text())
    assert s["heatmap"]["columns"] >= 20 and s["heatmap"]["rows"] == 30
    assert s["heatmap"]["no_sample_columns"] == []  # 60 s ± 300 ms: continuous
    n = pq.read_metadata(out / "consumers.parquet").num_rows
    assert n == 200
    layout = s["charts"]
    # the top N: a title and a figure per consumer; the rates chart: a name and the rates per
    # row for 25 consumers; the heat map: one name per queue. No two labels overlap.
    assert len(layout["top_lag"]["labels"]) == 2 * s["thresholds"]["top"]
    assert len(layout["rates"]["labels"]) == 2 * 25
    assert len(layout["heatmap"]["labels"]) == 30
    for name, c in layout.items():
        w, h = c["size"]
        assert not _overlaps(c["labels"]), name
        assert all(0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h for _, x0, y0, x1, y1 in c["labels"])
    # the table under the rates chart holds every consumer (200: all on the page)
    page = (out / "report.html").read_text()
    section = page[page.index("<h2>Each consumer against"):page.index("<h2>Topics</h2>")]
    assert len(re.findall(r"<tr><td", section)) == n
    # the same production figure for every reader of a topic, and the topic's own
    topics = {(r["broker"], r["topic"]): r["production_rate"]
              for r in table_rows(out, "topics")}
    for r in table_rows(out, "queues"):
        if not r["gone"]:
            assert r["production_rate"] is not None
    cons = table_rows(out, "consumers")
    # never draining: a lag that grows while consumption stays below production; one that rose at
    # an offset reset back (1% of the synthetic queues) and is read down faster is draining
    queues = table_rows(out, "queues")
    assert any(q["drain_status"] == "never" for q in queues)
    for q in queues:
        if q["drain_status"] == "never":
            assert q["consumption_rate"] <= q["production_rate"] and q["lag_slope"] > 0, q
    assert any(q["drain_status"] == "draining" and q["lag_slope"] > 0 for q in queues)
    for c in cons:  # every synthetic consumer reads one whole topic
        t = f"topic-{int(c['consumer'].split('-')[1]) % 40:03d}"
        assert c["production_rate"] == pytest.approx(topics[("kafka", t)], rel=1e-9)


@pytest.mark.slow  # Spark and Chromium
@pytest.mark.timeout(300)
def test_200_consumers_render_in_chromium(report_200, tmp_path: Path) -> None:
    """The page at 200 consumers renders; MQGW_REPORT_SCREENSHOT_200=path keeps the screenshot."""
    out, _ = report_200
    assert_renders(out / "report.html", tmp_path, (1280, 3000), "MQGW_REPORT_SCREENSHOT_200",
                   timeout=120)


@pytest.mark.slow  # Spark
@pytest.mark.timeout(300)
def test_real_hole_is_grey_and_production_is_per_topic(report_hole) -> None:
    out, _, times = report_hole
    s = json.loads((out / "summary.json").read_text())
    step = round(s["buckets"]["heat_s"] * 1000)
    first = times[0]
    grey = [to_ms(dt.datetime.fromisoformat(t)) for t in s["heatmap"]["no_sample_columns"]]
    before, after = times[HOLE.start - 1], times[HOLE.start]  # either side of the hole
    inside = [first + c * step for c in range(s["heatmap"]["columns"])
              if first + c * step >= before and first + (c + 1) * step <= after]
    assert len(inside) >= 4 and set(inside) <= set(grey), (inside, grey)
    assert all(g + step > before and g < after for g in grey), grey  # nothing grey elsewhere
    # production: the topic's, from its high watermarks over the window, for both consumers
    # (b's own samples, 5 msg/s per partition, would say otherwise than a's)
    span_s = (times[-1] - times[0]) / 1000
    want = 2 * (60 * 15 + 300 * 20) / span_s
    topics = table_rows(out, "topics")
    assert len(topics) == 1 and topics[0]["production_rate"] == pytest.approx(want, rel=1e-12)
    cons = {r["consumer"]: r for r in table_rows(out, "consumers")}
    assert cons["a"]["production_rate"] == cons["b"]["production_rate"] == \
        pytest.approx(want, rel=1e-12)
    assert rates.behind(cons["a"]) and not rates.behind(cons["b"])
