"""What bench/run.py and bench/soak.py share around a measured run, written once: the options that
pick and configure the gateway under test (its workers, extra environment, source tree, the record
size and where the JSON goes), the run's record (when, which command, which machine and code),
where that record is written, and SIGTERM turned into the same clean stop as Ctrl-C (every
process the run started is stopped)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def parser(doc: str | None, *, out: Path, workers_help: str, env_help: str,
           src_help: str) -> argparse.ArgumentParser:
    """A parser with the options every measured run takes; the caller adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--value-size", type=int, default=100, help="bytes per record value (100)")
    ap.add_argument("--workers", type=int, default=2, help=workers_help)
    ap.add_argument("--gateway-env", action="append", default=[], metavar="K=V", help=env_help)
    ap.add_argument("--gateway-src", default=str(ROOT), metavar="DIR", help=src_help)
    ap.add_argument("--out", default=str(out), help=f"the JSON result ({os.path.relpath(out, ROOT)})")
    return ap


def gateway_env(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """``base`` with the ``--gateway-env K=V`` options over it."""
    return {**base, **dict(kv.split("=", 1) for kv in args.gateway_env)}


def gateway_src(args: argparse.Namespace) -> Path:
    """The tree whose ``gateway`` package is served. Trees from before the layered package
    (``gateway/app.py``, older commits served for a before/after figure) count too."""
    src = Path(args.gateway_src).resolve()
    if not any((src / "gateway" / f).exists() for f in ("api/app.py", "app.py")):
        raise SystemExit(f"--gateway-src {src}: no gateway package there")
    return src


def git_head(src: Path) -> str:
    """The commit and whether gateway/ differs from it (read-only git commands)."""
    try:
        git = ["git", "--no-optional-locks", "-C", str(src)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--", "gateway"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return f"{head}{' (gateway/ modified)' if dirty else ''}" if head else "not a git checkout"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read().splitlines()
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import confluent_kafka
    import starlette
    import uvicorn
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_at_start": list(os.getloadavg()),
            "mem_total_mb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20,
            "confluent_kafka": confluent_kafka.__version__, "librdkafka": confluent_kafka.libversion()[0],
            "uvicorn": uvicorn.__version__, "starlette": starlette.__version__}


def record(args: argparse.Namespace, started: dt.datetime) -> dict[str, Any]:
    """The head of a run's JSON: when it started, its command line, the machine and its options."""
    return {"started": started.isoformat(timespec="seconds"),
            "command": " ".join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
            "machine": machine_info(),
            "config": {k: v for k, v in vars(args).items() if k != "out"}}


def stamp() -> str:
    """A run's local start time as it names the timestamped copy of its JSON."""
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def write(res: dict[str, Any], out: Path, copy_name: str) -> str:
    """The JSON to ``out`` and to a timestamped copy beside it (``copy_name``); returns it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(res, indent=2)
    out.write_text(text)
    (out.parent / copy_name).write_text(text)
    return text


def stop_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt, so a killed run stops what it started as Ctrl-C does."""
    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
