"""Benchmark ``mqgw report`` (the Spark job) on generated snapshots.

For each size N it writes synthetic snapshots (gateway.reports.synth.generate: numpy + pyarrow,
one Parquet file per sample, the layout ``mqgw snapshot`` writes), then runs the real command
``python -m gateway report --master local[2]`` on them in a child process and records its wall
time (JVM start included), rows/s and the child's peak RSS. Generation time is reported apart.

    .venv/bin/python bench/report_bench.py                       # 1M, 2M, 5M, 10M rows
    .venv/bin/python bench/report_bench.py --rows 1e6 --keep     # one size, keep the data
    .venv/bin/python bench/report_bench.py --rows 10e6 --consumers 174 --queues 8  # 10 days

Shape: ``--consumers`` x ``--queues`` rows per sample, samples ``--interval`` seconds apart, as many
samples as N needs (2,000 x 8 at 2 min: 10M rows = 625 samples, 20.8 h; 174 x 8: 10M rows =
7,200 samples, 10 days). Results go to bench/results/report_bench.json (and stdout).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import procstat  # noqa: E402
from gateway.reports import synth  # noqa: E402


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _machine() -> dict:
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f
                        if ln.startswith("model name")), cpu)
    except OSError:
        pass
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    import pyspark

    return {"cpus": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "pyspark": pyspark.__version__,
            "java": java[0] if java else None, "os": platform.platform()}


def run_one(rows: int, a: argparse.Namespace, base: Path) -> dict:
    per_sample = a.consumers * a.queues
    samples = math.ceil(rows / per_sample / 0.975)  # 5% of consumers start mid-window (~2.5%)
    data = base / f"snapshots-{rows}"
    marker = data / "_GENERATED.json"
    if marker.exists():
        gen = json.loads(marker.read_text())
    else:
        shutil.rmtree(data, ignore_errors=True)
        t = time.perf_counter()
        gen = synth.generate(data, consumers=a.consumers, queues=a.queues, samples=samples,
                             interval_s=a.interval, seed=1)
        gen["seconds"] = round(time.perf_counter() - t, 2)
        marker.write_text(json.dumps(gen))  # a name starting with "_": readers skip it
    print(f"  data: {gen['rows']:,} rows in {gen['files']:,} files, "
          f"{gen['bytes'] / 2**20:.0f} MiB, "
          f"generated in {gen['seconds']:.1f} s", flush=True)
    out = base / f"report-{rows}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "gateway", "report", "--snapshots", str(data), "--out", str(out),
           "--master", a.master, "--driver-memory", a.driver_memory, "--top", "10",
           "--conf", "spark.ui.enabled=false", *(x for c in a.conf for x in ("--conf", c))]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    r = procstat.run_tree(cmd, ROOT, env, poll_s=0.5)
    p, wall, peak = r.done, r.wall_s, r.peak_rss
    if p.returncode != 0:
        raise SystemExit(f"report failed ({p.returncode}):\n{p.stdout}\n{p.stderr[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    res = {
        "rows": gen["rows"], "files": gen["files"], "samples": samples,
        "consumers": a.consumers, "queues_per_consumer": a.queues, "interval_s": a.interval,
        "data_mib": round(gen["bytes"] / 2**20, 1), "generate_s": gen["seconds"],
        "report_wall_s": round(wall, 2), "report_spark_s": summary["elapsed_s"],
        "rows_per_s": round(gen["rows"] / wall),
        "peak_rss_mib": round(peak / 2**20),  # the command's process tree, JVM included
        "timings_s": summary.get("timings_s"),
        "queues": summary["counts"]["queues"], "stuck": summary["counts"]["stuck"],
        "idle": summary["counts"]["idle"], "report_mib": round(_du(out) / 2**20, 1),
    }
    print(f"  report: {res['report_wall_s']:.1f} s wall ({res['report_spark_s']:.1f} s after JVM "
          f"start), {res['rows_per_s']:,} rows/s, peak RSS {res['peak_rss_mib']:,} MiB; "
          f"{res['queues']:,} queues, {res['stuck']:,} stuck", flush=True)
    if not a.keep:
        shutil.rmtree(data, ignore_errors=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="+", type=float, default=[1e6, 2e6, 5e6, 10e6])
    ap.add_argument("--consumers", type=int, default=2000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--interval", type=float, default=120.0, help="seconds between samples")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE")
    ap.add_argument("--dir", help="where to put the data (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep (and reuse) the generated data")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "report_bench.json"))
    a = ap.parse_args()
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="mqgw-report-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for n in a.rows:
            print(f"{int(n):,} rows ({a.consumers} consumers x {a.queues} queues, "
                  f"{a.interval:g} s apart)", flush=True)
            results.append(run_one(int(n), a, base))
    finally:
        if not a.dir and not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    doc = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "machine": _machine(), "master": a.master, "driver_memory": a.driver_memory,
           "results": results}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{'rows':>12} {'files':>6} {'gen s':>7} {'report s':>9} {'rows/s':>10} {'RSS MiB':>8}")
    for r in results:
        print(f"{r['rows']:>12,} {r['files']:>6,} {r['generate_s']:>7.1f} "
              f"{r['report_wall_s']:>9.1f} "
              f"{r['rows_per_s']:>10,} {r['peak_rss_mib']:>8,}")
    print(f"\nwritten to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
