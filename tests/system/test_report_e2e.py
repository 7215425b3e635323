"""Real snapshots, taken by ``mqgw snapshot`` from a real gateway run, read back by ``mqgw report``."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark  # noqa: F401  (a dev dependency: missing is a failure, not a skip)
import pytest

from ..support import ROOT, Api, queue_id, unique

pytestmark = pytest.mark.slow  # a real run, snapshots and a Spark job

# `make test` installs Java; without it this suite must fail, not pass empty
assert shutil.which("java"), "Spark needs Java 17+ (Debian: openjdk-17-jre-headless)"

SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
             "PYSPARK_DRIVER_PYTHON": sys.executable}


def snapshot(redis_url: str, prefix: str, out: Path) -> None:
    import os

    subprocess.run([sys.executable, "-m", "gateway", "snapshot", "--once", "--out", str(out)],
                   cwd=ROOT, env={**os.environ, "MQGW_REDIS_URL": redis_url, "MQGW_KEY_PREFIX": prefix},
                   check=True, capture_output=True, timeout=60)


@pytest.mark.rocketmq  # also on RocketMQ's queue ids (issue 22: reports work on its queues)
@pytest.mark.timeout(300)
def test_report_reads_snapshots_of_a_real_run(node_factory: Callable[..., Any], make_topic, redis_url: str,
                                              tmp_path: Path) -> None:
    import os

    prefix = unique("e2e")  # only this run's consumers in the snapshots
    node = node_factory(key_prefix=prefix, alert_interval_ms=0)
    api = Api([node.url])
    topic, g = make_topic(2), unique("g")
    api.config(g, start="earliest")
    snaps, out = tmp_path / "snaps", tmp_path / "report"

    def produce(n: int) -> None:
        for p in (0, 1):
            api.produce_exact(topic, [f"v{i}" for i in range(n) if i % 2 == p], partition=p)

    def consume(n: int) -> None:
        left = n
        while left:
            body = api.message(consumer=g, topic=topic, max=min(left, 3), wait_ms=2000).json()
            assert body["status"] == "ok", body
            assert api.ack(body["requestId"]).json()["result"] == "committed"
            left -= len(body["messages"])

    produce(10)
    consume(2)
    snapshot(redis_url, prefix, snaps)
    time.sleep(1.1)
    produce(4)
    consume(6)
    snapshot(redis_url, prefix, snaps)
    time.sleep(1.1)
    consume(2)
    snapshot(redis_url, prefix, snaps)
    files = sorted(snaps.glob("date=*/hour=*/snap-*.parquet"))
    assert len(files) == 3
    view = {q["queue"]: q for q in api.http.get(api.url(f"/consumers/{g}/queues")).json()["queues"]}

    subprocess.run([sys.executable, "-m", "gateway", "report", "--snapshots", str(snaps), "--out", str(out),
                    "--master", "local[1]", "--driver-memory", "1g", "--conf", "spark.ui.enabled=false"],
                   cwd=ROOT, env={**os.environ, **SPARK_ENV}, check=True, capture_output=True, timeout=240)
    rows = {r["queue"]: r for r in pq.read_table(out / "queues.parquet").to_pylist()
            if r["consumer"] == g}
    assert set(rows) == {queue_id(0), queue_id(1)}
    # What the job should find, computed from the snapshot files themselves.
    samples: dict[str, list[dict]] = {}
    for f in files:
        for r in pq.read_table(f).to_pylist():
            if r["consumer"] == g:
                samples.setdefault(r["queue"], []).append(r)
    for q, r in rows.items():
        s = sorted(samples[q], key=lambda x: x["ts"])
        span = (s[-1]["ts"] - s[0]["ts"]).total_seconds()
        consumed = sum(max(0, b["committed_offset"] - a["committed_offset"])
                       for a, b in itertools.pairwise(s))
        produced = s[-1]["max_offset"] - s[0]["max_offset"]
        assert r["lag"] == s[-1]["max_offset"] - s[-1]["committed_offset"] == view[q]["backlog"]
        assert r["samples"] == 3
        assert r["consumption_rate"] == pytest.approx(consumed / span, rel=1e-9)
        assert r["production_rate"] == pytest.approx(produced / span, rel=1e-9)
    assert sum(r["consumed"] for r in rows.values()) == 8  # 10 committed in all, 2 before the first sample
    assert sum(r["lag"] for r in rows.values()) == 14 - 10
    assert (out / "report.html").stat().st_size > 10_000
