"""Synthetic snapshot writers for tests and benchmarks, in the format ``mqgw snapshot`` writes
(:mod:`gateway.core.snapshot_format`: the one definition of columns, layout and compression).

:func:`write_sample` writes one sample the way the real writer does (a dot-file renamed into
place). :func:`generate` writes a large, plausible data set with numpy and pyarrow, one sample at
a time (no Python loop per row), for ``bench/report_bench.py``; :func:`generate_dev` a small one
shaped like a ``make run`` deployment.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gateway.core import snapshot_format
from gateway.core.snapshot_format import COMPRESSION, SCHEMA, file_path, to_ms

#: What :func:`table_from_rows` fills in for a column a row leaves out.
ROW_DEFAULTS = {"broker": "kafka", "lock_timeout_ms": 30_000, "paused": False, "registered": False}


def write_sample(table: pa.Table, out_dir: str | os.PathLike[str], ts_ms: int,
                 tag: str = "synth") -> Path:
    """Write one sample's rows atomically (dot-file, then rename) where ``mqgw snapshot`` would.
    Test data: no fsync, and a name taken twice is replaced."""
    path = file_path(out_dir, ts_ms, tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression=COMPRESSION)
    os.replace(tmp, path)
    return path


def table_from_rows(ts: int | dt.datetime, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts by column name, ``ts`` left out) of one sample -> a table in :data:`SCHEMA`,
    with :data:`ROW_DEFAULTS` (:func:`gateway.core.snapshot_format.table_from_rows`)."""
    return snapshot_format.table_from_rows(ts, rows, ROW_DEFAULTS)


# -- a large synthetic data set (bench) ------------------------------------------------------------

def generate(out_dir: str | os.PathLike[str], *, consumers: int, queues: int, samples: int,
             interval_s: float = 120.0, start: dt.datetime | None = None, topics: int = 200,
             seed: int = 1, jitter_s: float = 0.0) -> dict[str, Any]:
    """Write ``samples`` files of up to ``consumers * queues`` rows each, ``interval_s`` apart
    (each sample time moved by up to ``jitter_s`` either way, as a real snapshotter's is).

    Every consumer reads one topic (``topic-<i % topics>``) with ``queues`` partitions. Each
    partition has its own production rate and offsets, the same for every consumer reading it
    (as in Kafka); most consumers keep up, some fall behind (10%), some are
    stuck (2%), some have a stale lock (0.5% of queues), some had an offset reset back (1%),
    some appear mid-window (5%), some are idle (3%), and every tenth one is a broadcast
    clientId. Returns ``{"rows", "files", "bytes"}``.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    start_ms = to_ms(start or dt.datetime(2024, 5, 1, tzinfo=dt.UTC))
    n = consumers * queues
    ci = np.repeat(np.arange(consumers), queues)  # consumer index of each key
    qi = np.tile(np.arange(queues), consumers)
    broadcast = ci % 10 == 0
    names = np.array([f"consumer-{i:05d}" for i in range(consumers)], dtype=object)
    client = np.where(broadcast, np.array([f"host-{i % 3}" for i in range(consumers)],
                                          dtype=object)[ci], "")
    str_cols = {
        "consumer": pa.array(names[ci], pa.string()),
        "client_id": pa.array(client, pa.string()),
        "mode": pa.array(np.where(broadcast, "broadcast", "cluster"), pa.string()),
        "broker": pa.array(np.full(n, "kafka", dtype=object), pa.string()),
        "topic": pa.array(np.array([f"topic-{i % topics:03d}" for i in range(consumers)],
                                   dtype=object)[ci], pa.string()),
        "queue": pa.array(qi.astype(str).astype(object), pa.string()),
    }
    kind = rng.random(consumers)[ci]  # per consumer: behaviour
    behind = kind < 0.10
    stuck = (kind >= 0.10) & (kind < 0.12)
    idle = (kind >= 0.12) & (kind < 0.15)
    part = (ci % topics) * queues + qi  # each key's partition: its topic's queue
    prod = rng.lognormal(mean=0.0, sigma=1.5, size=topics * queues)[part]  # msg/s, median 1
    cons = np.where(behind, prod * 0.8, prod * 1.5)
    lag0 = rng.integers(0, 10_000, size=n).astype(np.float64)
    max0 = rng.integers(0, 10**9, size=topics * queues)[part]
    stuck_at = rng.integers(0, samples, size=n)  # the sample from which a stuck queue stops
    late = rng.random(consumers)[ci] < 0.05
    first_sample = np.where(late, rng.integers(0, max(samples, 1), size=consumers)[ci], 0)
    reset = rng.random(n) < 0.01
    reset_at = rng.integers(0, samples, size=n)
    stale_lock = rng.random(n) < 0.005
    paused = pa.array(rng.random(n) < 0.01)
    registered = pa.array(np.ones(n, dtype=bool))
    lock_timeout = pa.array(np.full(n, 30_000, dtype=np.int64))
    rate_limit = pa.array(np.where(rng.random(n) < 0.05, 100.0, np.nan), pa.float64(),
                          from_pandas=True)
    low = pa.array(max0 // 2, pa.int64())
    out, rows, files, size = Path(out_dir), 0, 0, 0
    prev_committed = np.zeros(n, dtype=np.int64)
    jitter = rng.uniform(-jitter_s, jitter_s, size=samples) if jitter_s else np.zeros(samples)
    for s in range(samples):
        t = s * interval_s
        ts_ms = start_ms + round((t + jitter[s]) * 1000)
        max_off = max0 + np.floor(prod * t).astype(np.int64)
        lag = np.maximum(lag0 + (prod - cons) * t, 0.0)
        frozen = stuck & (s > stuck_at)
        lag = np.where(frozen, lag0 + prod * t, lag)  # nothing committed since stuck_at
        lag = np.where(reset & (s >= reset_at), lag + 5_000, lag)
        committed = np.maximum(max_off - np.floor(lag).astype(np.int64), 0)
        if s > 0:  # a stuck queue's committed offset stays exactly where it stopped
            committed = np.where(frozen, prev_committed, committed)
        prev_committed = committed
        lock_age = np.where(stale_lock, 60_000 + t * 1000,
                            rng.integers(0, 20_000, size=n).astype(np.float64))
        lock_age_mask = ~stale_lock & (rng.random(n) < 0.6)  # not locked right now
        last_access = np.where(idle, start_ms - 2 * 86_400_000,
                               ts_ms - rng.integers(0, 120_000, size=n))
        table = pa.Table.from_arrays(
            [pa.array(np.full(n, ts_ms, dtype=np.int64)).cast(SCHEMA.field("ts").type),
             *str_cols.values(),
             pa.array(max_off, pa.int64()), pa.array(committed, pa.int64()),
             low, pa.array(max_off, pa.int64()),
             pa.array(lock_age.astype(np.int64), pa.int64(), mask=lock_age_mask),
             lock_timeout, pa.array(last_access.astype(np.int64), pa.int64()),
             paused, registered, rate_limit, rate_limit,
             pa.array(last_access.astype(np.int64), pa.int64())],
            schema=SCHEMA)
        if late.any():
            table = table.filter(pa.array(first_sample <= s))
        path = write_sample(table, out, ts_ms, tag=f"bench{seed}")
        rows += table.num_rows
        files += 1
        size += path.stat().st_size
    return {"rows": rows, "files": files, "bytes": size}


# -- a small data set shaped like a `make run` deployment (tests, bench) ---------------------------

#: The delay levels of :func:`generate_dev` (topics ``mqgw.delay.<ms>ms``, 2 partitions each).
DEV_DELAY_LEVELS = 45


def generate_dev(out_dir: str | os.PathLike[str], *, samples: int = 86, interval_s: float = 60.0,
                 start: dt.datetime | None = None, seed: int = 7,
                 jitter_s: float = 0.2) -> dict[str, Any]:
    """A deployment as a user runs it: two topics of their own and the gateway's internal ones.

    - ``demo`` (6 partitions, ~1 msg/s each) read by ``demo-group``, which keeps up: it polls
      every few seconds and commits what it got, so each sample catches a lag of a few messages
      (what was produced since its last poll) and its consumption is production ± that noise;
    - ``demo`` also read by ``etl``, which consumes 70 % of production: its lag really grows;
    - ``orders`` (2 partitions, ~0.2 msg/s each) read by ``orders-svc``, keeping up, by the
      broadcast consumer ``cache`` (clientIds ``host-a``, ``host-b``), keeping up, and by
      ``newcomer``, only in the last sample, 5 messages behind (one sample: no trend);
    - the gateway's own: :data:`DEV_DELAY_LEVELS` delay-level topics ``mqgw.delay.*`` read by
      ``_mqgw.relay`` (records wait there until due: a lag that grows and falls), and a retry
      topic ``mqgw.retry.demo-group.demo.<digest>`` (4 partitions) read by ``demo-group``.

    About 110 rows per sample (86 samples: ~9,500 rows, an hour and a half at 60 s). Returns
    ``{"rows", "files", "bytes", "keeping_up", "growing", "new", "internal_topics"}``.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    start_ms = to_ms(start or dt.datetime(2024, 5, 1, tzinfo=dt.UTC))
    retry = "mqgw.retry.demo-group.demo.5f1c2a9e"
    levels = [f"mqgw.delay.{ms}ms" for ms in range(100, 100 * (DEV_DELAY_LEVELS + 1), 100)]
    # (consumer, client_id, topic, partitions, production msg/s per partition, behaviour)
    readers = [("demo-group", "", "demo", 6, 1.0, "keep"), ("etl", "", "demo", 6, 1.0, "slow"),
               ("orders-svc", "", "orders", 2, 0.2, "keep"),
               ("cache", "host-a", "orders", 2, 0.2, "keep"),
               ("cache", "host-b", "orders", 2, 0.2, "keep"),
               ("newcomer", "", "orders", 2, 0.2, "new"),
               ("demo-group", "", retry, 4, 0.02, "keep")]
    readers += [("_mqgw.relay", "", t, 2, 0.05, "hold") for t in levels]
    keys = [(c, k, t, str(q), rate, how) for c, k, t, n, rate, how in readers for q in range(n)]
    n = len(keys)
    part_of: dict[tuple[str, str], int] = {}
    part = np.array([part_of.setdefault((t, q), len(part_of)) for _, _, t, q, _, _ in keys])
    rate = np.zeros(len(part_of))
    for (_, _, _, _, r, _), p in zip(keys, part, strict=True):
        rate[p] = r
    how = np.array([h for *_, h in keys])
    hw = rng.integers(1000, 100_000, size=len(part_of)).astype(np.int64)
    committed = hw[part] - rng.integers(0, 3, size=n)
    str_cols = {
        "consumer": pa.array([c for c, *_ in keys], pa.string()),
        "client_id": pa.array([k for _, k, *_ in keys], pa.string()),
        "mode": pa.array(["broadcast" if k else "cluster" for _, k, *_ in keys], pa.string()),
        "broker": pa.array(["kafka"] * n, pa.string()),
        "topic": pa.array([t for _, _, t, *_ in keys], pa.string()),
        "queue": pa.array([q for _, _, _, q, *_ in keys], pa.string()),
    }
    out, rows, files, size = Path(out_dir), 0, 0, 0
    for s in range(samples):
        t_ms = start_ms + round((s * interval_s + rng.uniform(-jitter_s, jitter_s)) * 1000)
        if s:
            hw = hw + rng.poisson(rate * interval_s)
        top = hw[part]
        # keeping up: what was committed at its last poll, 0-8 s ago (a Poisson count of lag)
        behind_by = rng.poisson(rate[part] * rng.uniform(0, 8, size=n))
        keep = np.maximum(committed, top - behind_by)
        slow = np.minimum(top, committed + rng.poisson(0.7 * rate[part] * interval_s))
        # the relay holds records until due: its lag swings up and down
        hold = np.maximum(committed, top - rng.integers(0, 40, size=n))
        committed = np.where(how == "keep", keep, np.where(how == "slow", slow, hold)) \
            if s else committed
        committed = np.where(how == "new", top - 5, np.minimum(committed, top))
        last = pa.array(np.full(n, t_ms - 1000, dtype=np.int64), pa.int64())
        table = pa.Table.from_arrays(
            [pa.array(np.full(n, t_ms, dtype=np.int64)).cast(SCHEMA.field("ts").type),
             *str_cols.values(),
             pa.array(top, pa.int64()), pa.array(committed, pa.int64()),
             pa.array(np.zeros(n, dtype=np.int64), pa.int64()), pa.array(top, pa.int64()),
             pa.nulls(n, pa.int64()), pa.array(np.full(n, 30_000, dtype=np.int64), pa.int64()),
             last, pa.array(np.zeros(n, dtype=bool)), pa.array(np.ones(n, dtype=bool)),
             pa.nulls(n, pa.float64()), pa.nulls(n, pa.float64()), last],
            schema=SCHEMA)
        if s < samples - 1:
            table = table.filter(pa.array(how != "new"))
        path = write_sample(table, out, t_ms, tag=f"dev{seed}")
        rows += table.num_rows
        files += 1
        size += path.stat().st_size
    return {"rows": rows, "files": files, "bytes": size,
            "keeping_up": [("demo-group", ""), ("orders-svc", ""), ("cache", "host-a"),
                           ("cache", "host-b")],
            "growing": [("etl", "")], "new": [("newcomer", "")],
            "internal_topics": len(levels) + 1}
