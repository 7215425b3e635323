"""The snapshot schema the report reads, and synthetic snapshot writers for tests and benchmarks.

:data:`SCHEMA` is the contract with ``mqgw snapshot`` (gateway/snapshot.py): one row per (sample
time, consumer, clientId, broker, topic, queue), in files laid out as
``DIR/date=YYYY-MM-DD/hour=HH/snap-*.parquet`` (UTC). Files whose names start with ``.`` or ``_``
are being written (or are metadata) and are skipped by every reader, Spark included.

:func:`write_sample` writes one sample the way the real writer does (a dot-file renamed into
place). :func:`generate` writes a large, plausible data set with numpy and pyarrow, one sample at
a time (no Python loop per row), for ``bench/report_bench.py``.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("client_id", pa.string(), nullable=False),  # "" = cluster mode
        pa.field("mode", pa.string(), nullable=False),  # "cluster" | "broadcast"
        pa.field("broker", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue", pa.string(), nullable=False),
        pa.field("max_offset", pa.int64(), nullable=False),  # never decreases
        pa.field("committed_offset", pa.int64(), nullable=False),  # may jump back on a reset
        pa.field("low_watermark", pa.int64()),
        pa.field("high_watermark", pa.int64()),
        pa.field("lock_age_ms", pa.int64()),  # null = not locked
        pa.field("lock_timeout_ms", pa.int64(), nullable=False),
        pa.field("last_access_ms", pa.int64()),  # epoch ms of the last lock or commit
        pa.field("paused", pa.bool_(), nullable=False),
        pa.field("registered", pa.bool_(), nullable=False),
        pa.field("rate_limit", pa.float64()),
        pa.field("rate_tokens", pa.float64()),
        pa.field("last_poll_ms", pa.int64()),  # epoch ms of the last /message of the consumer key
    ]
)
COLUMNS = SCHEMA.names
COMPRESSION = "zstd"


def to_ms(t: int | float | dt.datetime) -> int:
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        return round(t.timestamp() * 1000)
    return int(t)


def sample_path(out_dir: str | os.PathLike[str], ts_ms: int, tag: str = "synth") -> Path:
    t = dt.datetime.fromtimestamp(ts_ms / 1000, dt.UTC)
    return (Path(out_dir) / f"date={t:%Y-%m-%d}" / f"hour={t:%H}"
            / f"snap-{t:%Y%m%dT%H%M%S}{ts_ms % 1000:03d}-{tag}.parquet")


def write_sample(table: pa.Table, out_dir: str | os.PathLike[str], ts_ms: int,
                 tag: str = "synth") -> Path:
    """Write one sample's rows atomically (dot-file, then rename) where ``mqgw snapshot`` would."""
    path = sample_path(out_dir, ts_ms, tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression=COMPRESSION)
    os.replace(tmp, path)
    return path


def table_from_rows(ts: int | dt.datetime, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts by column name, ``ts`` left out) of one sample -> a table in :data:`SCHEMA`.

    Defaults: ``client_id`` "", ``mode`` from client_id, ``broker`` "kafka", ``lock_timeout_ms``
    30000, ``paused``/``registered`` False, nullable columns null."""
    rows = list(rows)
    defaults = {"client_id": "", "broker": "kafka", "lock_timeout_ms": 30_000, "paused": False,
                "registered": False}
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for r in rows:
        unknown = set(r) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown column(s) {sorted(unknown)}")
        for c in COLUMNS[1:]:
            v = r.get(c, defaults.get(c))
            if c == "mode" and v is None:
                v = "broadcast" if r.get("client_id") else "cluster"
            if v is None and not SCHEMA.field(c).nullable:
                raise ValueError(f"column {c!r} may not be null: {r}")
            cols[c].append(v)
    cols["ts"] = [to_ms(ts)] * len(rows)
    return pa.Table.from_arrays([pa.array(cols[c], SCHEMA.field(c).type) for c in COLUMNS],
                                schema=SCHEMA)


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
