"""Markdown tables from several bench/run.py result files (one column per run, plus the median).

    .venv/bin/python bench/summarize.py bench/results/run-*.json [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

ROWS: list[tuple[str, str, Callable[[dict[str, Any]], float | None], str]] = []


def row(label: str, fmt: str, unit: str = "") -> Callable:
    def deco(fn: Callable[[dict[str, Any]], float | None]) -> Callable:
        ROWS.append((label, fmt, fn, unit))
        return fn
    return deco


def ph(r: dict[str, Any], name: str) -> dict[str, Any] | None:
    return r["phases"].get(name)


def get(r: dict[str, Any], name: str, *path: str) -> float | None:
    d: Any = ph(r, name)
    for k in path:
        if d is None:
            return None
        d = d.get(k)
    return d


row("raw produce, records/s", "{:,.0f}")(lambda r: r["raw"]["produce"]["records_per_s"])
row("raw consume, records/s", "{:,.0f}")(lambda r: r["raw"]["consume"]["records_per_s"])
row("p1: produce 1 rec/req, req/s", "{:,.0f}")(lambda r: get(r, "p1", "req_per_s"))
row("p1: p50 ms", "{:.2f}")(lambda r: get(r, "p1", "latency_ms", "p50"))
row("p1: p99 ms", "{:.2f}")(lambda r: get(r, "p1", "latency_ms", "p99"))
row("p1: ratio to raw produce", "{:.4f}")(lambda r: r["ratios"].get("p1"))
row("p100: produce 100 rec/req, records/s", "{:,.0f}")(lambda r: get(r, "p100", "records_per_s"))
row("p100: p50 ms", "{:.2f}")(lambda r: get(r, "p100", "latency_ms", "p50"))
row("p100: p99 ms", "{:.2f}")(lambda r: get(r, "p100", "latency_ms", "p99"))
row("p100: ratio to raw produce", "{:.3f}")(lambda r: r["ratios"].get("p100"))
for name, label in (("f32", "f32: fetch+ack max=32"), ("f1000", "f1000: fetch+ack max=1000"),
                    ("f32pb", "f32pb: max=32, ack piggy-backed"), ("f32r", "f32r: max=32 offered 40k/s")):
    row(f"{label}, records/s", "{:,.0f}")(lambda r, n=name: get(r, n, "records_per_s"))
    row(f"{name}: /message p50 ms", "{:.2f}")(lambda r, n=name: get(r, n, "message_latency_ms", "p50"))
    row(f"{name}: /message p99 ms", "{:.2f}")(lambda r, n=name: get(r, n, "message_latency_ms", "p99"))
    if name != "f32pb":
        row(f"{name}: /ack p50 ms", "{:.2f}")(lambda r, n=name: get(r, n, "ack_latency_ms", "p50"))
        row(f"{name}: /ack p99 ms", "{:.2f}")(lambda r, n=name: get(r, n, "ack_latency_ms", "p99"))
    row(f"{name}: ratio to raw consume", "{:.3f}")(lambda r, n=name: r["ratios"].get(n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    runs = []
    for name in args.files:
        with open(name) as f:
            runs.append(json.load(f))
    head = ["figure", *(r["started"][11:] for r in runs), "median"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, fmt, fn, _ in ROWS:
        vals = []
        for r in runs:
            try:
                vals.append(fn(r))
            except (KeyError, TypeError):
                vals.append(None)
        present = [v for v in vals if v is not None]
        if not present:
            continue
        cells = [fmt.format(v) if v is not None else "-" for v in vals]
        cells.append(fmt.format(statistics.median(present)))
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    print("| CPU % of one core (measured window) | " + " | ".join(r["started"][11:] for r in runs) + " |")
    print("|" + "---|" * (len(runs) + 1))
    for name in runs[0]["phases"]:
        cells = []
        for r in runs:
            c = (ph(r, name) or {}).get("cpu_pct")
            if not c:
                cells.append("-")
                continue
            w = "+".join(f"{c[k]:.0f}" for k in c if k.startswith("worker"))
            cells.append(f"gw {w}, broker {c['broker']:.0f}, redis {c['redis']:.0f}, "
                         f"loadgen {c['loadgen']:.0f}, others {c['others_pct_of_one_core']:.0f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
