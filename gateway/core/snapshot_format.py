"""The snapshot file format: the one definition that ``mqgw snapshot`` writes, the report job reads
and the synthetic test data follows.

:mod:`gateway.ops.snapshot` (the writer) and :mod:`gateway.reports` (the Spark reader and
:mod:`gateway.reports.synth`) are independent siblings, so the contract between them sits here,
below both. It is a format and nothing else: columns, their types and nullability, the file
layout and compression, and rows -> table; writing files (fsync, rename, name clashes) is the
writer's, reading them the reader's.

One sample is one Parquet file with one row per (sample time, consumer, clientId, broker, topic,
queue), laid out for Spark's partition discovery::

    DIR/date=YYYY-MM-DD/hour=HH/snap-<YYYYmmddTHHMMSSmmm>-<tag>.parquet     (UTC)

Names that start with ``.`` or ``_`` are being written (or are metadata) and every reader,
Spark included, skips them.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

#: The columns. Add new ones at the end only, nullable (files written before them read as null),
#: and raise the version.
SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("ms", tz="UTC"), nullable=False),  # sample time, same for all rows
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("client_id", pa.string(), nullable=False),  # "" in cluster mode
        pa.field("mode", pa.string(), nullable=False),  # "cluster" | "broadcast"
        pa.field("broker", pa.string(), nullable=False),  # the adapter's name: "kafka"
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue", pa.string(), nullable=False),  # partition number as a string
        # max(stored max, watermark hi): never decreases
        pa.field("max_offset", pa.int64(), nullable=False),
        pa.field("committed_offset", pa.int64(), nullable=False),  # may jump back on a reset
        pa.field("low_watermark", pa.int64()),  # the shared watermark hash; null if not listed
        pa.field("high_watermark", pa.int64()),
        pa.field("lock_age_ms", pa.int64()),  # null when the queue is not locked
        pa.field("lock_timeout_ms", pa.int64(), nullable=False),
        pa.field("last_access_ms", pa.int64()),  # epoch ms of the last lock or commit; null if never
        pa.field("paused", pa.bool_(), nullable=False),
        pa.field("registered", pa.bool_(), nullable=False),
        pa.field("rate_limit", pa.float64()),  # messages/s; null when not rate limited
        pa.field("rate_tokens", pa.float64()),  # bucket refilled to Redis' time; null when not limited
        # epoch ms of the consumer's (clientId's) last /message, whatever it returned; null if never
        # (and in files written before it existed)
        pa.field("last_poll_ms", pa.int64()),
    ],
    metadata={"mqgw.snapshot.version": "2"},
)
COLUMNS: list[str] = SCHEMA.names
#: Parquet compression. Spark 3 and later read zstd natively.
COMPRESSION = "zstd"

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NAMED = re.compile(r"snap-(\d{8}T\d{6})(\d{3})-")


def to_ms(ts: float | dt.datetime) -> int:
    """A sample time as epoch milliseconds: a number is taken as such, a datetime must carry its
    time zone (a naive one would silently be the host's local time)."""
    if isinstance(ts, dt.datetime):
        if ts.tzinfo is None:
            raise ValueError("ts must be timezone-aware (UTC)")
        return (ts - _EPOCH) // dt.timedelta(milliseconds=1)
    return int(ts)


def file_path(out_dir: str | os.PathLike[str], ts: float | dt.datetime, tag: str) -> Path:
    """Where the sample taken at ``ts`` goes: ``tag`` tells writers apart (the snapshotter's host
    and pid, a generator's name), so two never pick the same name for the same millisecond."""
    ms = to_ms(ts)
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return (Path(out_dir) / f"date={t:%Y-%m-%d}" / f"hour={t:%H}"
            / f"snap-{t:%Y%m%dT%H%M%S}{ms % 1000:03d}-{tag}.parquet")


def name_time(name: str) -> int | None:
    """The sample time (epoch ms) that :func:`file_path` put in a file's name; None for a name it
    did not make."""
    m = _NAMED.match(name)
    if m is None:
        return None
    t = dt.datetime.strptime(m[1], "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    return round(t.timestamp()) * 1000 + int(m[2])


def table_from_columns(ts: float | dt.datetime, cols: Mapping[str, list[Any]]) -> pa.Table:
    """One sample's columns (every name of :data:`SCHEMA` but ``ts``) -> a table in the schema."""
    n = len(cols["consumer"])
    arrays = [pa.array([to_ms(ts)] * n, SCHEMA.field("ts").type)]
    arrays += [pa.array(cols[c], SCHEMA.field(c).type) for c in COLUMNS[1:]]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def table_from_rows(ts: float | dt.datetime, rows: Iterable[Mapping[str, Any]],
                    defaults: Mapping[str, Any]) -> pa.Table:
    """One sample's rows (dicts by column name, ``ts`` left out) -> a table in :data:`SCHEMA`.

    A column a row leaves out takes its value from ``defaults``, ``client_id`` "" and ``mode``
    from the client_id; a nullable one is null, and a required one is an error."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS[1:]}
    for r in rows:
        unknown = set(r) - set(COLUMNS[1:])
        if unknown:
            raise ValueError(f"unknown column(s): {sorted(unknown)}")
        client = r.get("client_id", defaults.get("client_id", ""))
        implied = {"client_id": client, "mode": "broadcast" if client else "cluster"}
        for c in COLUMNS[1:]:
            v = r.get(c, defaults.get(c, implied.get(c)))
            if v is None and not SCHEMA.field(c).nullable:
                raise ValueError(f"column {c!r} may not be null: {dict(r)}")
            cols[c].append(v)
    return table_from_columns(ts, cols)
