"""What an idle worker costs while every broker is down, per librdkafka setting (issue 32).

The adapter re-bootstraps (``metadata.recovery.strategy=rebootstrap``) because a node with
``none`` never came back from a fenced broker (tests/system/test_broker_fenced.py); this
measures what that costs while the broker is really gone: a worker (relay on, as ``mqgw serve``
runs) pointed at a closed port, its CPU and the threads it creates over a window, one run per
setting, alternating, in one run::

    .venv/bin/python bench/broker_down.py --window 20 --rounds 2

Settings compared: the adapter's (rebootstrap, reconnect.backoff.ms=1000), ``none`` with the
same backoff (what the adapter ran before issue 32), and librdkafka's own (rebootstrap, 100 ms).
Needs redis-server (started here); no broker.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import procstat  # noqa: E402
from gateway.cli import devstack  # noqa: E402
from tests.support import start_node  # noqa: E402

SETTINGS = {
    "adapter (rebootstrap, backoff 1 s)": "",
    "none, backoff 1 s (before issue 32)": "metadata.recovery.strategy=none",
    "librdkafka's (rebootstrap, backoff 100 ms)": "reconnect.backoff.ms=100",
}


def _tids(pid: int) -> set[str]:
    try:
        return set(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return set()


def measure(redis_url: str, kafka_config: str, window: float) -> tuple[float, float]:
    """(% of a core, new threads a second) of one idle worker whose broker port is closed."""
    extra = {"kafka_config": kafka_config} if kafka_config else {}
    node = start_node(redis_url, f"127.0.0.1:{devstack.free_port()}", Path(tempfile.mkdtemp()),
                      relay="true", **extra)
    try:
        time.sleep(3)  # past start-up: the clients are made and failing
        pid = node.proc.pid
        c0, t0 = procstat.proc_cpu_s(pid), time.monotonic()
        before = _tids(pid)
        seen = set(before)
        while time.monotonic() - t0 < window:
            seen |= _tids(pid)
            time.sleep(0.002)
        elapsed = time.monotonic() - t0
        return 100 * (procstat.proc_cpu_s(pid) - c0) / elapsed, len(seen - before) / elapsed
    finally:
        node.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured per run")
    ap.add_argument("--rounds", type=int, default=2, help="runs per setting, alternating")
    args = ap.parse_args()
    redis = devstack.start_redis()
    try:
        rows: dict[str, list[tuple[float, float]]] = {k: [] for k in SETTINGS}
        for _ in range(args.rounds):
            for name, cfg in SETTINGS.items():
                rows[name].append(measure(redis.extra["url"], cfg, args.window))
        print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("| setting | % of a core | new threads/s |\n| --- | --- | --- |")
        for name, got in rows.items():
            cpu = ", ".join(f"{c:.1f}" for c, _ in got)
            threads = ", ".join(f"{t:.0f}" for _, t in got)
            print(f"| {name} | {cpu} | {threads} |")
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
