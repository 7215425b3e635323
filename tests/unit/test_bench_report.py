"""``make bench``'s report (bench/run.py): a peer that was skipped is reported as skipped (it
ended the run with ``KeyError: 'phases'`` after the gateway's table, issue 35)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run_module() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_run", BENCH / "run.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_a_skipped_peer_is_reported_as_skipped() -> None:
    run = _run_module()
    res = {"phases": {"p1": {"records_per_s": 1000.0, "latency_ms": {"p99": 5.0}}},
           "peer": {"name": "Strimzi HTTP bridge", "skipped": "its folder is missing"}}
    assert run.report_peer(res) == "Strimzi HTTP bridge: skipped (its folder is missing)"


def test_a_peer_that_ran_is_compared_phase_by_phase() -> None:
    run = _run_module()
    phase = {"records_per_s": 1000.0, "latency_ms": {"p99": 5.0}}
    res = {"phases": {"p1": phase},
           "peer": {"name": "bridge", "phases": {"p1": {**phase, "records_per_s": 500.0,
                                                         "cpu_pct": {"bridge": 90.0}}}}}
    table = run.report_peer(res)
    assert "| p1 |" in table and "| 2.00 |" in table
