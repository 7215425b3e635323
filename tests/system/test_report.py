"""``mqgw report`` (gateway/reports) on synthetic snapshots with known answers.

One data set holds every case; the job runs on it once with ``local[2]`` through the real CLI
(module-scoped fixture), once by ``spark-submit`` on a Spark standalone cluster (a master and one
worker on 127.0.0.1, started and stopped here), and its report.html is rendered in headless
Chromium.

Numbers are chosen so the figures are exact in floating point: samples are 64 s apart and every
span is a power of two seconds (2048, 1024, 512), so every rate (an integer count / span) and every
sum of rates is a dyadic fraction that doubles represent exactly, and every expected value is
compared with ``==``. The exception is the lag slope: Spark's ``regr_slope`` updates its moments
incrementally (dividing by the running count), so even an exactly linear series can come out a
few ulps off; slopes (and their sums) are compared to 1e-9 relative / absolute, about a million
ulps tighter than any difference that matters.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from fractions import Fraction
from pathlib import Path

import matplotlib  # noqa: F401  (dev dependencies: missing is a failure, not a skip)
import pyarrow.parquet as pq
import pyspark
import pytest

from gateway.core import snapshot_format
from gateway.reports import job, synth

from ..support.report import ROOT, assert_renders, run_report, spark_env, table_rows

# `make test` installs Java; without it this suite must fail, not pass empty
assert shutil.which("java"), "Spark needs Java 17+ (Debian: openjdk-17-jre-headless)"

T0 = dt.datetime(2024, 5, 1, 23, 30, tzinfo=dt.UTC)  # the window crosses midnight
T0_MS = snapshot_format.to_ms(T0)
STEP_S = 64
K = 32  # samples k = 0..32 in the window: span 2048 s
END_MS = T0_MS + K * STEP_S * 1000
UNTIL_MS = END_MS + STEP_S * 1000  # the sample at k = 33 lies on --until (exclusive): left out
ARGS = ["--since", "2024-05-01T23:30:00Z", "--until", "2024-05-02T00:05:12Z", "--top", "3",
        "--stuck-after", "10m40s", "--idle-after", "1h"]  # stuck after 640 s = 10 intervals
CONF = ["--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4"]


def ts(k: int) -> int:
    return T0_MS + k * STEP_S * 1000


def _rows_at(k: int) -> list[dict]:
    """Every queue's row in sample k (k < 0: before the window, 33: on --until)."""
    t = ts(k)
    rows = []

    def add(consumer, topic, queue, max_offset, committed, client_id="", **kw):
        rows.append({"consumer": consumer, "client_id": client_id, "topic": topic, "queue": queue,
                     "max_offset": max_offset, "committed_offset": committed,
                     "last_access_ms": t - 1000, "registered": True, **kw})

    if k < 0:  # before --since: values that would wreck rates and slopes if read
        add("steady", "orders", "0", 0, 0)
        add("resetter", "events", "1", 0, 0)
        return rows
    if k > K:  # on --until
        add("drainer", "events", "0", 10**9, 0)
        return rows
    # steady: 5 msg/s in and out; queue 0 has no lag, queue 1 a constant lag of 100
    add("steady", "orders", "0", 100_000 + 320 * k, 100_000 + 320 * k, lock_age_ms=1000)
    add("steady", "orders", "1", 200_000 + 320 * k, 200_000 + 320 * k - 100)
    # stuck/0: nothing committed all window (stuck: 2048 s); /1: frozen from k=22 (640 s, the
    # threshold exactly: not stuck); /3: frozen from k=21 (704 s: stuck); /2: moving, but the last
    # sample has a lock held past its timeout (an earlier one did too: does not count)
    add("stuck", "orders", "0", 100_000 + 320 * k, 90_000)
    add("stuck", "orders", "1", 200_000 + 320 * k, 200_000 + 320 * min(k, 22) - 50)
    add("stuck", "orders", "2", 300_000 + 320 * k, 300_000 + 320 * k - 20,
        lock_age_ms={32: 90_000, 10: 99_999}.get(k))
    add("stuck", "orders", "3", 400_000 + 320 * k, 400_000 + 320 * min(k, 21) - 10)
    # drainer: 2 msg/s in, 12 out, lag 40000 -> 19520 (-10/s)
    add("drainer", "events", "0", 1_000_000 + 128 * k, 1_000_000 + 128 * k - (40_000 - 640 * k))
    # resetter: 5 msg/s; at k=16 an operator moves the committed offset back by 4000
    add("resetter", "events", "1", 500_000 + 320 * k,
        500_000 + 320 * k - (500 if k < 16 else 4820))
    # late: a cluster consumer that appears at k=16, 2 msg/s, no lag
    if k >= 16:
        add("late", "events", "0", 1_000_000 + 128 * k, 1_000_000 + 128 * k)
    # fanout (broadcast): c1 keeps up at 4 msg/s; c2 appears at k=24 and consumes 6 msg/s;
    # c0 has not been seen for two hours (an idle clientId of a busy consumer)
    add("fanout", "audit", "0", 700_000 + 256 * k, 700_000 + 256 * k, client_id="c1",
        last_access_ms=t - 500)
    if k >= 24:
        add("fanout", "audit", "0", 700_000 + 256 * k, 700_000 + 256 * k - (3000 - 128 * (k - 24)),
            client_id="c2")
    add("fanout", "audit", "0", 650_000, 650_000, client_id="c0",
        last_access_ms=T0_MS - 7_200_000)
    # c3 is stalled behind a backlog, then expires at k=16 (its hash is gone): stuck if counted
    if k < 16:
        add("fanout", "audit", "0", 660_000, 659_500, client_id="c3", last_access_ms=t - 700)
    # sleepy never accessed anything; edge was last seen exactly --idle-after before the end
    add("sleepy", "audit", "0", 600_000, 600_000, last_access_ms=None)
    add("edge", "audit", "1", 800_000, 800_000, last_access_ms=END_MS - 3_600_000)
    # quiet: caught up on a quiet partition, nothing locked or committed for two hours, but it
    # keeps polling: seen, not idle
    add("quiet", "audit", "1", 800_000, 800_000, last_access_ms=T0_MS - 7_200_000,
        last_poll_ms=t - 2000)
    return rows


def write_dataset(d: Path) -> None:
    for k in range(-2, K + 2):
        t = synth.table_from_rows(ts(k), _rows_at(k))
        if k < 8:  # written by a snapshotter from before last_poll_ms: read as null
            t = t.drop_columns(["last_poll_ms"])
        synth.write_sample(t, d, ts(k))
    # a sample still being written (a dot-file): must be ignored
    junk = synth.table_from_rows(ts(K), [{"consumer": "drainer", "topic": "events", "queue": "0",
                                          "max_offset": 10**12, "committed_offset": 0}])
    part = snapshot_format.file_path(d, ts(K), "synth").parent
    pq.write_table(junk, part / ".snap-in-progress.parquet.tmp")
    # a file damaged by a copy (not a dot-file: it is read, and must be skipped, not fail the job)
    (part / "snap-damaged-in-a-copy.parquet").write_bytes(b"PAR1" + b"\x00garbage" * 100)


def _slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope, exactly (Fractions), of lag against seconds."""
    n = len(points)
    mx = Fraction(sum(x for x, _ in points), n)
    my = Fraction(sum(y for _, y in points), n)
    return float(sum((x - mx) * (y - my) for x, y in points)
                 / sum((x - mx) ** 2 for x, _ in points))


RESET_SLOPE = _slope([(STEP_S * k, 500 if k < 16 else 4820) for k in range(K + 1)])

# (consumer, client_id, topic, queue) -> expected figures
QUEUES = {
    ("steady", "", "orders", "0"): dict(lag=0, lag_slope=0.0, production_rate=5.0,
                                         consumption_rate=5.0, drain_s=0.0,
                                         drain_status="drained", stalled_s=0.0, stuck=False,
                                         samples=33, span_s=2048.0),
    # a constant lag: neither grows nor shrinks (before issue 20: "never", as consumption was
    # not above production)
    ("steady", "", "orders", "1"): dict(lag=100, lag_slope=0.0, production_rate=5.0,
                                         consumption_rate=5.0, drain_s=None, drain_status="steady",
                                         noise_lag=320.0, stalled_s=0.0, stuck=False),
    ("stuck", "", "orders", "0"): dict(lag=20_240, lag_slope=5.0, production_rate=5.0,
                                        consumption_rate=0.0, drain_s=None, drain_status="never",
                                        stalled_s=2048.0, stuck_backlog=True, stuck_lock=False,
                                        stuck=True, committed_offset=90_000),
    ("stuck", "", "orders", "1"): dict(lag=3250, production_rate=5.0,
                                        consumption_rate=7040 / 2048, drain_status="never",
                                        stalled_s=640.0, stuck_backlog=False, stuck=False),
    ("stuck", "", "orders", "2"): dict(lag=20, lag_slope=0.0, production_rate=5.0,
                                        consumption_rate=5.0, drain_status="steady", stalled_s=0.0,
                                        stuck_backlog=False, stuck_lock=True, stuck=True,
                                        lock_age_ms=90_000,
                                        lock_timeout_ms=30_000),
    ("stuck", "", "orders", "3"): dict(lag=3530, consumption_rate=6720 / 2048, stalled_s=704.0,
                                        drain_status="never",
                                        stuck_backlog=True, stuck_lock=False, stuck=True),
    ("drainer", "", "events", "0"): dict(lag=19_520, lag_slope=-10.0, production_rate=2.0,
                                          consumption_rate=12.0, drain_s=1952.0,
                                          drain_status="draining", stalled_s=0.0, stuck=False,
                                          max_offset=1_000_000 + 128 * K),
    ("resetter", "", "events", "1"): dict(lag=4820, lag_slope=RESET_SLOPE, production_rate=5.0,
                                           consumption_rate=9920 / 2048, drain_s=None,
                                           drain_status="never", stalled_s=0.0, stuck=False,
                                           produced=320 * K, consumed=31 * 320, samples=33),
    ("late", "", "events", "0"): dict(lag=0, production_rate=2.0, consumption_rate=2.0,
                                       span_s=1024.0, samples=17, drain_status="drained"),
    ("fanout", "c1", "audit", "0"): dict(lag=0, production_rate=4.0, consumption_rate=4.0,
                                          mode="broadcast"),
    ("fanout", "c2", "audit", "0"): dict(lag=1976, lag_slope=-2.0, production_rate=4.0,
                                          consumption_rate=6.0, drain_s=988.0,
                                          drain_status="draining", span_s=512.0, samples=9,
                                          mode="broadcast"),
    # production is the partition's (audit/0: 4 msg/s, from c1's offsets), whatever offsets
    # this reader's own rows carry
    ("fanout", "c0", "audit", "0"): dict(lag=0, production_rate=4.0, consumption_rate=0.0,
                                          drain_status="drained", stalled_s=0.0, stuck=False),
    ("fanout", "c3", "audit", "0"): dict(lag=500, stalled_s=960.0, samples=16, gone=True,
                                          drain_status="steady"),
    ("sleepy", "", "audit", "0"): dict(lag=0, production_rate=4.0, consumption_rate=0.0,
                                        last_access_ms=None, mode="cluster"),
    ("edge", "", "audit", "1"): dict(lag=0, last_access_ms=END_MS - 3_600_000, last_poll_ms=None,
                                      last_seen_ms=END_MS - 3_600_000),
    ("quiet", "", "audit", "1"): dict(lag=0, last_poll_ms=END_MS - 2000, last_seen_ms=END_MS - 2000),
}
SLOPES = {"lag_slope"}

CONSUMERS = {
    ("steady", ""): dict(queues=2, topics=1, lag=100, production_rate=10.0, consumption_rate=10.0,
                         drain_status="steady", drain_s=None, stuck_queues=0, idle=False),
    ("stuck", ""): dict(queues=4, lag=27_040, production_rate=20.0,
                        consumption_rate=5.0 + (7040 + 6720) / 2048, drain_status="never",
                        stuck_queues=3, idle=False),
    ("drainer", ""): dict(lag=19_520, lag_slope=-10.0, drain_status="draining", drain_s=1952.0),
    ("resetter", ""): dict(lag=4820, drain_status="never"),
    ("fanout", "c2"): dict(lag=1976, drain_s=988.0, drain_status="draining", idle=False),
    ("fanout", "c0"): dict(lag=0, drain_s=0.0, drain_status="drained", idle=True,
                           idle_s=(END_MS - (T0_MS - 7_200_000)) / 1000),
    ("sleepy", ""): dict(idle=True, idle_s=None, last_access_ms=None),
    ("edge", ""): dict(idle=False, idle_s=3600.0),
    ("quiet", ""): dict(idle=False, idle_s=2.0, last_access_ms=T0_MS - 7_200_000,
                        last_poll_ms=END_MS - 2000, last_seen_ms=END_MS - 2000),
    ("late", ""): dict(idle=False, consumption_rate=2.0, lag=0, drain_status="drained"),
}

TOPICS = {
    ("kafka", "orders"): dict(partitions=4, subscriptions=2, lag=27_140, production_rate=20.0,
                              consumption_rate=10.0 + 5.0 + (7040 + 6720) / 2048,
                              stuck_queues=3),
    ("kafka", "events"): dict(partitions=2, subscriptions=3, lag=24_340, production_rate=7.0,
                              consumption_rate=12.0 + 9920 / 2048 + 2.0, stuck_queues=0,
                              lag_slope=-10.0 + RESET_SLOPE),
    ("kafka", "audit"): dict(partitions=2, subscriptions=6, lag=1976, production_rate=4.0,
                             consumption_rate=10.0, stuck_queues=0, lag_slope=-2.0),
}


# -- helpers ---------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    return spark_env(SPARK_LOCAL_IP="127.0.0.1", **extra)


def _index(rows: list[dict], *key: str) -> dict[tuple, dict]:
    return {tuple(r[k] for k in key): r for r in rows}


def _check(actual: dict, expected: dict, what) -> None:
    for col, want in expected.items():
        got = actual[col]
        if col in SLOPES and want is not None:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (what, col, got, want)
        else:
            assert got == want, (what, col, got, want)


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("snapshots")
    write_dataset(d)
    return d


@pytest.fixture(scope="module")
def local_report(snapshots: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report-local")
    p = run_report(snapshots, out, *ARGS, *CONF, env=_env(), timeout=240)
    assert "report.html" in p.stdout
    return out


# -- the figures -----------------------------------------------------------------------------------

@pytest.mark.slow  # Spark
@pytest.mark.timeout(300)
def test_queue_figures(local_report: Path) -> None:
    rows = _index(table_rows(local_report, "queues"), "consumer", "client_id", "topic", "queue")
    assert set(rows) == set(QUEUES)
    for key, want in QUEUES.items():
        _check(rows[key], want, key)
        assert rows[key]["gone"] == want.get("gone", False), key
    # the reset: committed went back 4000; rate from positive increments only, over the window
    r = rows[("resetter", "", "events", "1")]
    assert r["consumption_rate"] == 9920 * 1000.0 / 2_048_000 > 0
    # production is a property of the partition: one figure for all of its readers
    by_part: dict[tuple, set] = {}
    for (_, _, topic, queue), r in rows.items():
        by_part.setdefault((topic, queue), set()).add(r["production_rate"])
    assert all(len(v) == 1 for v in by_part.values()), by_part
    # every queue's time to drain follows the formula
    for r in rows.values():
        if r["drain_status"] == "draining":
            assert r["drain_s"] == r["lag"] / (r["consumption_rate"] - r["production_rate"])
    # the in-progress dot-file and the samples outside [since, until) were not read
    assert rows[("drainer", "", "events", "0")]["last_ts"] == dt.datetime.fromtimestamp(
        END_MS / 1000, dt.UTC)
    assert rows[("steady", "", "orders", "0")]["first_ts"] == T0


@pytest.mark.slow  # Spark
@pytest.mark.timeout(300)
def test_consumers_topics_top(local_report: Path) -> None:
    cons = _index(table_rows(local_report, "consumers"), "consumer", "client_id")
    assert set(cons) == {("steady", ""), ("stuck", ""), ("drainer", ""), ("resetter", ""),
                         ("late", ""), ("fanout", "c0"), ("fanout", "c1"), ("fanout", "c2"),
                         ("sleepy", ""), ("edge", ""), ("quiet", "")}
    for key, want in CONSUMERS.items():
        _check(cons[key], want, key)
    topics = _index(table_rows(local_report, "topics"), "broker", "topic")
    assert set(topics) == set(TOPICS)
    for key, want in TOPICS.items():
        _check(topics[key], want, key)
    top = table_rows(local_report, "top")
    assert [(r["rank"], r["consumer"], r["client_id"], r["lag"]) for r in top] == [
        (1, "stuck", "", 27_040), (2, "drainer", "", 19_520), (3, "resetter", "", 4820)]


@pytest.mark.slow  # Spark
@pytest.mark.timeout(300)
def test_stuck_and_idle(local_report: Path) -> None:
    stuck = table_rows(local_report, "stuck")
    assert [(r["consumer"], r["queue"], r["reason"], r["stalled_s"], r["lag"]) for r in stuck] == [
        ("stuck", "0", "no progress", 2048.0, 20_240),
        ("stuck", "3", "no progress", 704.0, 3530),
        ("stuck", "2", "lock expired", 0.0, 20)]
    idle = table_rows(local_report, "idle")
    assert [(r["kind"], r["consumer"], r["client_id"], r["idle_s"]) for r in idle] == [
        ("consumer", "sleepy", "", None),
        ("clientId", "fanout", "c0", 9248.0)]


@pytest.mark.slow  # Spark
@pytest.mark.timeout(300)
def test_outputs_and_summary(local_report: Path) -> None:
    for name in job.TABLES:
        assert (local_report / f"{name}.parquet").is_file()
        csv = (local_report / f"{name}.csv").read_text()
        assert csv.splitlines()[0].startswith('"')  # a header row
    assert not list(local_report.glob(".*"))  # no temporary files left
    s = json.loads((local_report / "summary.json").read_text())
    # c3 is gone: in the queue count, but not in consumers, stuck or never draining. Never
    # draining (a lag that grows): stuck/0, /1, /3 and the resetter's jump; not a constant lag
    assert s["counts"] == {"rows": 16 * 33 - 16 - 24 - 17, "queues": 16, "gone": 1,
                           "samples": 33, "consumers": 11, "topics": 3, "stuck": 3, "idle": 2,
                           "never": 4, "behind": 2}  # behind production: stuck, resetter
    assert s["window"]["first_sample"] == "2024-05-01T23:30:00.000Z"
    assert s["window"]["last_sample"] == "2024-05-02T00:04:08.000Z"
    assert s["window"]["span_s"] == 2048.0
    assert s["totals"]["lag"] == 27_140 + 24_340 + 1976
    assert s["totals"]["production_rate"] == 31.0
    assert s["thresholds"] == {"stuck_after_s": 640.0, "idle_after_s": 3600.0, "top": 3}
    page = (local_report / "report.html").read_text()
    # self-contained: every image inline, nothing fetched
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    imgs = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(imgs) == 4
    for b in imgs:
        assert base64.b64decode(b)[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.index("Stuck queues") < page.index("Top 3 consumers")
    # production per topic, consumption per consumer: never "all consumers" summed beside it
    assert "Behind production · per consumer" in page and "Produced · per topic" in page
    assert "all consumers" not in page


# -- Chromium --------------------------------------------------------------------------------------

@pytest.mark.slow  # Spark and Chromium
@pytest.mark.timeout(180)
def test_report_renders_in_chromium(local_report: Path, tmp_path: Path) -> None:
    """MQGW_REPORT_SCREENSHOT=path keeps the screenshot."""
    assert_renders(local_report / "report.html", tmp_path, (1400, 2400), "MQGW_REPORT_SCREENSHOT",
                   timeout=120)


# -- a real Spark standalone cluster ---------------------------------------------------------------

def _spark_home() -> Path:
    return Path(pyspark.__file__).resolve().parent


def _wait_for(cond, timeout: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: a process exited with {p.returncode}")
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _master_state(ui_port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return json.load(r)
    except OSError:
        return {}


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def _compare_tables(a: Path, b: Path) -> None:
    """The same rows in the same order; floats equal up to summation order."""
    for name in job.TABLES:
        ta, tb = pq.read_table(a / f"{name}.parquet"), pq.read_table(b / f"{name}.parquet")
        assert ta.schema == tb.schema, name
        ra, rb = ta.to_pylist(), tb.to_pylist()
        assert len(ra) == len(rb), name
        for x, y in zip(ra, rb, strict=True):
            for col in x:
                if isinstance(x[col], float) and isinstance(y[col], float):
                    assert x[col] == pytest.approx(y[col], rel=1e-12, abs=1e-12), (name, col, x)
                else:
                    assert x[col] == y[col], (name, col, x, y)


@pytest.mark.slow  # a Spark standalone cluster
@pytest.mark.timeout(420)
def test_standalone_cluster_matches_local(snapshots: Path, local_report: Path,
                                          tmp_path: Path) -> None:
    home = _spark_home()
    spark_class, submit = home / "bin" / "spark-class", home / "bin" / "spark-submit"
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    env = _env(SPARK_HOME=str(home), SPARK_WORKER_DIR=str(tmp_path / "work"),
               SPARK_LOG_DIR=str(tmp_path / "logs"), SPARK_NO_DAEMONIZE="1")
    master_url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        mlog = open(tmp_path / "master.log", "wb")  # noqa: SIM115 - closed in the finally below
        logs.append(mlog)
        procs.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=mlog, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for(lambda: _master_state(ui).get("status") == "ALIVE", 90, "the Spark master",
                  procs)
        wlog = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed in the finally below
        logs.append(wlog)
        procs.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", master_url,
             "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
             str(worker_ui), "--work-dir", str(tmp_path / "work")],
            env=env, stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True))
        _wait_for(lambda: _master_state(ui).get("aliveworkers", 0) >= 1, 90,
                  "the Spark worker to register", procs)
        out = tmp_path / "report-cluster"
        cmd = [str(submit), "--master", master_url, "--conf", "spark.ui.enabled=false",
               "--conf", "spark.executor.memory=512m", "--driver-memory", "1g",
               str(ROOT / "gateway" / "reports" / "job.py"),
               "--snapshots", str(snapshots), "--out", str(out), *ARGS, *CONF]
        p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-5000:]
        s = json.loads((out / "summary.json").read_text())
        assert s["spark"]["master"] == master_url
        apps = _master_state(ui).get("completedapps", []) + _master_state(ui).get("activeapps", [])
        assert any(a.get("id") == s["spark"]["app_id"] for a in apps)  # it ran on the cluster
        _compare_tables(local_report, out)
    finally:
        for p in reversed(procs):
            _stop(p)
        for f in logs:
            f.close()


def test_durations_and_times() -> None:
    assert job.parse_duration("10m") == 600
    assert job.parse_duration("1h30m") == 5400
    assert job.parse_duration("10m40s") == 640
    assert job.parse_duration("90") == 90
    assert job.parse_duration("2d") == 172_800
    assert job.parse_duration("500ms") == 0.5
    for bad in ("", "10x", "-5m", "0", "m10"):
        with pytest.raises(ValueError):
            job.parse_duration(bad)
    assert job.parse_time("2024-05-01T23:30:00Z") == T0_MS
    assert job.parse_time("2024-05-01T23:30") == T0_MS  # UTC when no offset is given
    assert job.parse_time("2024-05-02T01:30:00+02:00") == T0_MS
    with pytest.raises(ValueError):
        job.parse_time("yesterday")


def test_spark_reads_the_snapshot_format() -> None:
    """The report reads every column of the one format definition that ``mqgw snapshot`` and the
    synthetic writers write, in order, each nullable (a file from before a column read as null)."""
    from gateway.reports import lag

    assert [f.name for f in lag.INPUT_SCHEMA.fields] == snapshot_format.COLUMNS
    assert all(f.nullable for f in lag.INPUT_SCHEMA.fields)


@pytest.mark.timeout(60)
def test_usage_errors(tmp_path: Path) -> None:
    """Bad arguments fail fast, before Spark starts."""
    base = [sys.executable, "-m", "gateway", "report", "--out", str(tmp_path / "r")]
    for args, msg in (
        (["--snapshots", str(tmp_path / "missing")], "is not a directory"),
        (["--snapshots", str(tmp_path), "--stuck-after", "soon"], "invalid duration"),
        (["--snapshots", str(tmp_path), "--since", "2024-05-02", "--until", "2024-05-01"],
         "--until must be after --since"),
    ):
        p = subprocess.run(base + args, env=_env(), cwd=ROOT, capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)
    assert math.isfinite(RESET_SLOPE) and RESET_SLOPE > 0
