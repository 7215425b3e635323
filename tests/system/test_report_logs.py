"""``mqgw report``'s Spark writes its log4j lines as JSON, not its own text (gateway/reports/job.py).

Before, the JVM Spark starts printed "Using Spark's default log4j profile", "Setting default log
level to WARN", a hint about sc.setLogLevel and plain-text lines (``26/11/27 04:35:02 WARN
NativeCodeLoader: …``) to the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import ROOT

#: The one line outside log4j's reach: the JVM's own, for the module Spark's launcher adds.
JVM_LINE = "WARNING: Using incubator modules"

SESSION = """
import argparse, sys, tempfile
from pathlib import Path
from gateway.reports import job
ap = argparse.ArgumentParser()
job.add_arguments(ap)
args = ap.parse_args(["--snapshots", ".", "--out", ".", "--master", "local[1]",
                      "--driver-memory", "512m", "--log-level", "info",
                      "--conf", "spark.ui.enabled=false"])
with tempfile.TemporaryDirectory() as tmp:
    spark = job._session(args, Path(tmp))
print(spark.range(3).count())
spark.stop()
"""


@pytest.mark.slow  # Spark
@pytest.mark.timeout(900)
def test_spark_logs_json_lines_only() -> None:
    """The session the report runs in, at --log-level info (many lines): every line Spark
    writes is one JSON object of the gateway's log shape, and the level holds from the start."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}  # start a JVM
    p = subprocess.run([sys.executable, "-c", SESSION], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=840)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "3"
    records, other = [], []
    for line in p.stderr.splitlines():
        if not line.strip() or line.startswith(JVM_LINE):
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            other.append(line)
    assert not other, other[:10]
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records), records[:5]
    # info from the start: the JVM's first lines, before the session's setLogLevel
    assert any(r["level"] == "INFO" and r["logger"] == "org.apache.spark.SparkContext"
               and r["msg"].startswith("Running Spark version") for r in records), records[:5]
    assert not any("NativeCodeLoader" in r["logger"] for r in records)


def test_log_level_is_checked_before_spark_starts(tmp_path: Path) -> None:
    """A level log4j does not know would be ignored by it: refused at once instead."""
    p = subprocess.run([sys.executable, "-m", "gateway", "report", "--snapshots", str(tmp_path),
                        "--out", str(tmp_path / "r"), "--log-level", "loud"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "--log-level" in p.stderr and "WARN" in p.stderr
