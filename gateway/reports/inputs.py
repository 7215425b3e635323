"""Which snapshot files hold samples of the report's window, found in plain Python before Spark.

Starting Spark costs seconds of JVM start and more of planning before the first answer, so a
window without a single sample (a typo in ``--since``, snapshots that stopped) is answered from
the files alone: ``mqgw report`` says "no samples" without starting Spark. The files found are
also what Spark reads, instead of every file under the directory.

A file's time comes from its name when ``mqgw snapshot`` (or :mod:`gateway.reports.synth`) named
it (``snap-YYYYmmddTHHMMSSmmm-….parquet``, :func:`gateway.core.snapshot_format.name_time`: every
row of a sample has that ``ts``), else from the
min/max statistics of ``ts`` in its Parquet footer; a file whose footer cannot be read is kept
(Spark skips it as corrupt). Names starting with ``.`` or ``_`` are skipped, as Spark skips them
(files being written, metadata). ``date=`` directories outside the window (a day of slack on
either side, as :func:`gateway.reports.lag.read_samples` prunes) are not even listed.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from gateway.core.snapshot_format import name_time

_DATE_DIR = re.compile(r"date=(\d{4}-\d{2}-\d{2})")
_DAY = dt.timedelta(days=1)


def local_dir(snapshots: str) -> Path | None:
    """The local directory of ``snapshots`` (a path or a ``file:`` URI), None for other URIs
    (HDFS, S3: listed by Spark only)."""
    if "://" not in snapshots:
        return Path(snapshots)
    u = urlparse(snapshots)
    return Path(unquote(u.path)) if u.scheme == "file" and u.netloc in ("", "localhost") else None


def window_files(root: Path, since_ms: int | None, until_ms: int | None) -> list[Path]:
    """The Parquet files under ``root`` that may hold a sample in [since, until), sorted."""
    lo = _day(since_ms, -_DAY) if since_ms is not None else None
    hi = _day(until_ms, _DAY) if until_ms is not None else None
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith((".", "_"))
                         and _date_ok(x, lo, hi))
        for name in files:
            if name.startswith((".", "_")) or not name.endswith(".parquet"):
                continue
            path = Path(d) / name
            first, last = _time_span(path)
            if first is None or last is None:
                out.append(path)  # unknown: let Spark decide
            elif (since_ms is None or last >= since_ms) and (until_ms is None or first < until_ms):
                out.append(path)
    return sorted(out)


def _day(ms: int, slack: dt.timedelta) -> str:
    return (dt.datetime.fromtimestamp(ms / 1000, dt.UTC) + slack).strftime("%Y-%m-%d")


def _date_ok(name: str, lo: str | None, hi: str | None) -> bool:
    m = _DATE_DIR.fullmatch(name)
    if m is None:
        return True
    return (lo is None or m[1] >= lo) and (hi is None or m[1] <= hi)


def _time_span(path: Path) -> tuple[int | None, int | None]:
    """(first, last) sample time in the file, epoch ms; (None, None) when unknown."""
    ms = name_time(path.name)
    return (ms, ms) if ms is not None else _footer_span(path)


def _footer_span(path: Path) -> tuple[int | None, int | None]:
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        col = meta.schema.to_arrow_schema().get_field_index("ts")
        if col < 0:
            return None, None
        lo = hi = None
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(col).statistics
            if st is None or not st.has_min_max:
                return None, None
            a, b = _ms(st.min), _ms(st.max)
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        return lo, hi
    except Exception:  # noqa: BLE001 - a damaged file: Spark skips it (ignoreCorruptFiles)
        return None, None


def _ms(v: dt.datetime | int) -> int:
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return round(v.timestamp() * 1000)
    return int(v)
