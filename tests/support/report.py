"""What the ``mqgw report`` tests share: the real command in a child process on local Spark, the
tables it writes, and a screenshot of its page in headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def spark_env(**extra: str) -> dict[str, str]:
    """This environment, with this Python for Spark's workers and without an inherited JVM."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               **extra)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


def run_report(snaps: Path, out: Path, *extra: str, env: dict[str, str] | None = None,
               timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """``mqgw report`` on ``local[2]`` with 1 GB for the driver and no Spark UI; it must succeed."""
    cmd = [sys.executable, "-m", "gateway", "report", "--snapshots", str(snaps), "--out",
           str(out), "--master", "local[2]", "--driver-memory", "1g",
           "--conf", "spark.ui.enabled=false", *extra]
    p = subprocess.run(cmd, env=spark_env() if env is None else env, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr[-5000:]
    return p


def table_rows(out: Path, name: str) -> list[dict[str, Any]]:
    """The report's table ``name`` (``queues``, ``consumers``, …) as row dicts."""
    return pq.read_table(out / f"{name}.parquet").to_pylist()


def assert_renders(page: Path, tmp_path: Path, size: tuple[int, int], keep_env: str,
                   timeout: float = 200) -> None:
    """The page renders in headless Chromium at ``size`` into more than a blank page (text, cards
    and charts: over 1,000 colours). ``$keep_env=path`` keeps the screenshot to look at."""
    from PIL import Image  # matplotlib's dependency

    assert os.path.exists(CHROMIUM), "chromium is not installed (make system installs it)"
    shot = tmp_path / "report.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
           f"--screenshot={shot}", f"--window-size={size[0]},{size[1]}", page.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0 and shot.is_file(), p.stderr[-3000:]
    if os.environ.get(keep_env):
        shutil.copy(shot, os.environ[keep_env])
    with Image.open(shot) as im:
        assert im.size == size
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 24) or []) > 1000
