"""``mqgw report`` on a small deployment's snapshots: the fixed cost, and the "no samples" answer.

Issue 20: a report over ~9,500 rows (an hour and a half of a `make run`-like deployment, 60 s
snapshots: two user topics and the gateway's 45 delay levels and a retry topic) took about two
minutes, and a window without a sample took 1 min 39 s to say so. This writes that data set
(:func:`gateway.reports.synth.generate_dev`) and runs the real command on it in a child process,
``--runs`` times per case, recording the wall time and the CPU time (user + system) of the whole
process tree (the JVM is a grandchild), read from /proc (:func:`procstat.run_tree`). CPU time is
the figure to compare on a shared machine: it does not grow when other processes take the cores,
wall time does.

    .venv/bin/python bench/report_dev.py                      # report, and a window without samples
    .venv/bin/python bench/report_dev.py --runs 3 --case report --conf spark.sql.adaptive.enabled=false

Results go to stdout and bench/results/report_dev.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import procstat  # noqa: E402
from gateway.reports import synth  # noqa: E402


def run(cmd: list[str], src: Path = ROOT) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    r = procstat.run_tree(cmd, src, env, poll_s=0.2)
    rc = r.done.returncode
    return {"rc": rc, "wall_s": round(r.wall_s, 2), "cpu_s": round(r.cpu_s, 2),
            "stderr_tail": r.done.stderr[-2000:] if rc else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "mqgw-report-dev")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--case", choices=("report", "empty", "all"), default="all")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--include-internal", action="store_true")
    ap.add_argument("--src", type=Path, default=ROOT,
                    help="run the gateway package of this source tree (e.g. an older version "
                         "from `git archive`), from its directory")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "report_dev.json")
    a = ap.parse_args()
    data = a.dir / "snapshots"
    if not (data / "_GENERATED.json").exists():
        shutil.rmtree(data, ignore_errors=True)
        gen = synth.generate_dev(data)
        (data / "_GENERATED.json").write_text(json.dumps(gen))  # "_": readers skip it
    gen = json.loads((data / "_GENERATED.json").read_text())
    print(f"data: {gen['rows']:,} rows in {gen['files']} files, {gen['bytes'] / 1024:.0f} KiB",
          flush=True)
    base = [sys.executable, "-m", "gateway", "report", "--snapshots", str(data),
            "--master", a.master, "--conf", "spark.ui.enabled=false",
            *(x for c in a.conf for x in ("--conf", c))]
    if a.include_internal:
        base.append("--include-internal")
    cases = {"report": [*base, "--out", str(a.dir / "report")],
             # a window a year after the data: no file in it
             "empty": [*base, "--out", str(a.dir / "empty"), "--since", "2025-05-01T00:00:00Z",
                       "--until", "2025-05-02T00:00:00Z"]}
    results: dict = {"data": gen, "master": a.master, "conf": a.conf, "src": str(a.src),
                     "include_internal": a.include_internal,
                     "load_before": os.getloadavg(), "cases": {}}
    for name, cmd in cases.items():
        if a.case not in (name, "all"):
            continue
        runs = []
        for _ in range(a.runs):
            r = run(cmd, a.src)
            if name == "report" and r["rc"] == 0:
                s = json.loads((a.dir / "report" / "summary.json").read_text())
                r["timings_s"] = s.get("timings_s")
                r["counts"] = s["counts"]
            runs.append(r)
            print(f"{name}: rc {r['rc']}, wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, "
                  f"load {os.getloadavg()[0]:.1f}{' ' + r['stderr_tail'] if r['rc'] > 2 else ''}",
                  flush=True)
        results["cases"][name] = {
            "runs": runs, "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_cpu_s": statistics.median(r["cpu_s"] for r in runs)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
