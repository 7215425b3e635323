"""``mqgw report`` on a deployment as a user runs it (issue 20).

- A consumer that keeps up (caught a few messages behind at each sample, consuming 99.9 % of
  production on one partition and 100.1 % on the next) is healthy: not ``never`` draining, not
  behind production. Only a lag that really grows is.
- The gateway's own topics (delay levels, retry topics) and consumers (``_mqgw.*``) stay out of
  the report unless ``--include-internal``: two user topics are reported as two, not 48.
- A window without a sample is answered from the files, without starting Spark.

The fast tests run without Spark; the slow ones run the real command (``local[2]``) on the
synthetic data of :func:`gateway.reports.synth.generate_dev`.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gateway.config import Settings
from gateway.core.names import INTERNAL_PREFIX, internal_topic_prefixes
from gateway.core.snapshot_format import file_path, to_ms
from gateway.reports import inputs, job, rates, synth

from ..support.report import ROOT, assert_renders, run_report, spark_env, table_rows

START = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
T0 = to_ms(START)


def _internal(topic: str, consumer: str) -> bool:
    return topic.startswith(internal_topic_prefixes(Settings())) or \
        consumer.startswith(INTERNAL_PREFIX)


# -- no Spark --------------------------------------------------------------------------------------

def _sample(d: Path, ms: int, name: str | None = None) -> Path:
    t = synth.table_from_rows(ms, [{"consumer": "c", "topic": "t", "queue": "0",
                                    "max_offset": 10, "committed_offset": 5}])
    if name is None:
        return synth.write_sample(t, d, ms)
    path = file_path(d, ms, "synth").with_name(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path)
    return path


def test_window_files_are_found_without_spark(tmp_path: Path) -> None:
    hour = 3_600_000
    named = [_sample(tmp_path, T0 + k * hour) for k in range(4)]  # 00:00 .. 03:00
    other = _sample(tmp_path, T0 + 2 * hour + 1, "part-0001.parquet")  # time from its footer
    damaged = named[0].with_name("snap-damaged.parquet")
    damaged.write_bytes(b"PAR1garbage")
    (named[0].parent / ".snap-being-written.parquet.tmp").write_bytes(b"")
    old = _sample(tmp_path, T0 - 10 * 86_400_000)  # ten days before: its date= is not listed
    found = inputs.window_files(tmp_path, T0 + hour, T0 + 3 * hour)
    assert found == sorted([named[1], named[2], other, damaged])  # damaged: Spark skips it
    assert inputs.window_files(tmp_path, None, None) == sorted([*named, other, damaged, old])
    assert inputs.window_files(tmp_path, T0 + 5 * hour, None) == [damaged]
    assert inputs.window_files(tmp_path, None, T0 - 20 * 86_400_000) == []
    assert inputs.local_dir(tmp_path.as_uri()) == tmp_path
    assert inputs.local_dir("hdfs://nn/snaps") is None


def _run_without_pyspark(*args: str) -> subprocess.CompletedProcess:
    """`mqgw report` in a Python where pyspark cannot be imported: anything that gets as far as
    starting Spark fails with "pyspark is missing"."""
    code = ("import sys; sys.modules['pyspark'] = None; from gateway.reports import job; "
            f"raise SystemExit(job.main({list(args)!r}))")
    return subprocess.run([sys.executable, "-c", code], env=spark_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_no_samples_is_said_before_spark_starts(tmp_path: Path) -> None:
    for k in range(3):
        _sample(tmp_path / "s", T0 + k * 60_000)
    base = ["--snapshots", str(tmp_path / "s"), "--out", str(tmp_path / "r")]
    p = _run_without_pyspark(*base, "--since", "2025-01-01T00:00:00Z")
    assert p.returncode == 2, p.stderr
    assert "no samples" in p.stderr and "2025-01-01T00:00:00.000Z" in p.stderr, p.stderr
    assert "pyspark" not in p.stderr
    # a window with samples goes on to Spark (here: no pyspark, so it stops there)
    p = _run_without_pyspark(*base, "--since", "2024-05-01T00:00:00Z")
    assert p.returncode == 2 and "pyspark is missing" in p.stderr, p.stderr
    assert not (tmp_path / "r").exists()


def test_internal_names_are_gateway_core_s() -> None:
    i = job._internal(False)
    assert i["topic_prefixes"] == list(internal_topic_prefixes(Settings.load()))
    assert {"mqgw.delay.", "mqgw.retry."} <= set(i["topic_prefixes"])
    assert i["consumer_prefixes"] == [INTERNAL_PREFIX] == ["_mqgw"]


def test_behind_is_a_growing_lag_not_a_rate_below_production() -> None:
    keeps_up = {"consumer": "a", "client_id": "", "lag": 4, "consumption_rate": 0.999,
                "production_rate": 1.0, "drain_status": "steady"}
    grows = dict(keeps_up, consumer="b", lag=900, consumption_rate=0.7, drain_status="never")
    assert not rates.behind(keeps_up) and rates.behind(grows)
    assert [r["consumer"] for r in rates.ranked([keeps_up, grows])] == ["b", "a"]


# -- the real job ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dev(tmp_path_factory) -> tuple[Path, dict]:
    snaps = tmp_path_factory.mktemp("devsnaps")
    return snaps, synth.generate_dev(snaps, start=START)


@pytest.fixture(scope="module")
def dev_report(dev, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("devreport")
    run_report(dev[0], out)
    return out


@pytest.mark.slow  # Spark
@pytest.mark.timeout(600)
def test_a_consumer_that_keeps_up_is_healthy(dev, dev_report: Path) -> None:
    _, gen = dev
    cons = {(r["consumer"], r["client_id"]): r for r in table_rows(dev_report, "consumers")}
    queues = table_rows(dev_report, "queues")
    for key in gen["keeping_up"]:
        c = cons[key]
        assert c["drain_status"] in ("steady", "drained"), c
        assert not rates.behind(c), c
        assert c["drain_s"] is None or c["drain_s"] == 0.0
    mine = [q for q in queues if (q["consumer"], q["client_id"]) in gen["keeping_up"]]
    assert mine and all(q["drain_status"] in ("steady", "drained") for q in mine)
    # what the rates alone said: with a lag, and consuming a hair below production (noise), which
    # was "never drains" and "behind production" before
    noisy = [q for q in mine if q["lag"] > 0 and q["consumption_rate"] < q["production_rate"]]
    assert noisy, "the data set no longer has the case this test is about"
    assert all(0.95 < q["consumption_rate"] / q["production_rate"] < 1.05 for q in mine)
    # the consumer that really falls behind is still called out
    for key in gen["growing"]:
        assert cons[key]["drain_status"] == "never" and rates.behind(cons[key])
    for key in gen["new"]:  # one sample (and its noise band without a span: no 0/0)
        assert cons[key]["drain_status"] == "unknown" and not rates.behind(cons[key])
        assert cons[key]["lag"] == 10
    s = json.loads((dev_report / "summary.json").read_text())
    assert s["counts"]["behind"] == len(gen["growing"])
    assert s["counts"]["never"] == sum(1 for q in queues if (q["consumer"], q["client_id"])
                                       in gen["growing"])
    # the page: no red "never" in the row of a consumer that keeps up
    page = (dev_report / "report.html").read_text()
    section = page[page.index("<h2>Each consumer against"):page.index("<h2>Topics</h2>")]
    for tr in re.findall(r"<tr><td.*?</tr>", section):
        name = re.search(r"<b>([^<]+)</b>", tr)[1]
        if name in {c for c, _ in gen["growing"]}:
            assert "pill red" in tr, tr
        else:
            assert "pill red" not in tr and 'class="bad"' not in tr, tr


@pytest.mark.slow  # Spark
@pytest.mark.timeout(600)
def test_internal_topics_and_consumers_are_left_out(dev, dev_report: Path) -> None:
    s = json.loads((dev_report / "summary.json").read_text())
    assert s["counts"]["topics"] == 2  # demo and orders; not the 45 delay levels nor the retry
    assert s["counts"]["consumers"] == 6
    assert s["internal"]["included"] is False
    for name in ("queues", "consumers", "topics", "stuck", "idle", "top"):
        for r in table_rows(dev_report, name):
            assert not _internal(r.get("topic", ""), r.get("consumer", "")), (name, r)
    page = (dev_report / "report.html").read_text()
    assert "· 2 topics" in page and "internal ones left out" in page
    assert "mqgw.delay." not in page.split("<main>")[1]  # only in the header's tooltip
    assert s["files"] == 86 and s["counts"]["samples"] == 86
    assert s["spark"]["small_input"] is True  # 0.6 MB of files: the quick JVM settings


@pytest.mark.slow  # Spark
@pytest.mark.timeout(600)
def test_include_internal_reports_them(tmp_path: Path) -> None:
    snaps = tmp_path / "snaps"
    gen = synth.generate_dev(snaps, samples=6, start=START)
    run_report(snaps, tmp_path / "r", "--include-internal")
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["internal"]["included"] is True
    assert s["counts"]["topics"] == 2 + gen["internal_topics"]
    consumers = {r["consumer"] for r in table_rows(tmp_path / "r", "consumers")}
    assert "_mqgw.relay" in consumers
    assert "internal ones left out" not in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.slow  # Spark and Chromium
@pytest.mark.timeout(300)
def test_dev_report_renders_in_chromium(dev_report: Path, tmp_path: Path) -> None:
    """MQGW_REPORT_SCREENSHOT_DEV=path keeps the screenshot."""
    assert_renders(dev_report / "report.html", tmp_path, (1400, 2400), "MQGW_REPORT_SCREENSHOT_DEV")
