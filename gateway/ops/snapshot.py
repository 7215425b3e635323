"""``mqgw snapshot``: sample every consumer's queue state from Redis into Parquet files.

One sample is one file with one row per (time, consumer, clientId, broker, topic, queue), laid
out for Spark's partition discovery (the format, shared with the report job, is
:mod:`gateway.core.snapshot_format`'s; here the tag in the name is ``<host>-<pid>``)::

    DIR/date=YYYY-MM-DD/hour=HH/snap-<YYYYmmddTHHMMSSmmm>-<host>-<pid>.parquet     (UTC)

Files are only ever added (append-only). Each one is written under a name starting with ``.``
in its final directory, fsynced and then renamed into place (``os.replace``; the directory is
fsynced too). Spark, pyarrow datasets and Hive skip names that start with ``.`` or ``_``, so a
reader sees a whole file or none.

**Why Parquet and not JSON Lines.** The report job reads weeks of samples of thousands of
consumers, billions of rows, with Spark:

- The columns are typed (int64 offsets, a UTC timestamp, booleans, real nulls), so every reader
  agrees on them. JSON needs a schema on read, and ``schema inference`` over 10M lines is a
  full extra pass.
- The files are small. Consecutive rows repeat consumer, topic and mode, and offsets change
  slowly. Dictionary, RLE and zstd encoding make a sample of 80,000 rows 0.6 MB, against 33 MB
  as JSON Lines and 2 MB gzipped (bench/snapshot_cost.py). There is nothing to parse either.
- Spark reads Parquet natively: ``spark.read.parquet(DIR)`` discovers the ``date``/``hour``
  partitions, so a ``--since/--until`` filter on them skips whole directories (partition
  pruning). It also reads only the columns it needs (column pruning) and skips row groups by
  their min/max statistics.
- Appending as JSON Lines would mean one growing file per hour, which a reader can catch half
  written. Whole immutable files renamed into place cannot be caught that way.

The price is the pyarrow dependency, and that a file is not human-readable (use
``python -c "import pyarrow.parquet as pq; print(pq.read_table(F))"``).

**Reading Redis without hurting it.** Only bounded commands are used (``gateway/store/scan.py``
carries them out; the key names are ``gateway/store/keys.py``'s):

1. ``SCAN <cursor> MATCH P:{*}:q* COUNT 1000``. It walks the keyspace in steps of ~1000 slots
   (every primary on Redis Cluster), finding cluster-mode queue hashes ``P:{G}:q`` and broadcast
   ones ``P:{G}:q:<clientId>``.
2. ``HSCAN <key> 0 COUNT 1000`` for each queue hash and each topic's watermark hash. A hash of up
   to 128 fields (21 queues) comes back whole from that one call, just as HGETALL would. A larger
   one is continued with its cursor in the next pipeline. So no single reply grows with the number
   of queues a consumer has, as an HGETALL's would. (On such small hashes HSCAN costs about 7 µs
   against HGETALL's 4.5 µs.)
3. ``HGETALL`` of each consumer's ``P:{G}:cfg``, which the registry bounds to a few dozen fields,
   and beside it one ``EVALSHA`` of ``bucket_level.lua``: the rate-limit bucket refilled to Redis'
   time by the same prelude function choose.lua refills it with (two HMGETs and a TIME, writing
   nothing). It replaced an HGETALL of ``P:{G}:rl``, a TIME per sample and a Python copy of the
   refill, so the pipelines and round trips are as many as before; the script is loaded once per
   process (``SCRIPT LOAD``). It costs Redis about 5 µs for a consumer without a rate limit and
   12 µs for one with a limit, against 1 µs for the HGETALL of the bucket (INFO commandstats,
   best of 10 runs of 5,000 calls each, on a busy 2-core machine): a pipeline of 50 consumers,
   all rate limited, holds Redis for about as long as one of 100 HSCANs (below).

There is no KEYS and no MULTI. Pipelines hold :data:`CHUNK` (100) commands. Redis runs
a pipeline's commands back to back, up to 16 KB of them per event-loop turn, so other clients
wait for at most ~100 × 7 µs. With 500 that would be ~220 commands per turn, which is visible in
bench/snapshot_cost.py as more PINGs over 1 ms, and it made the read no faster. On Redis
Cluster a pipeline is split by node, and a hash is never split across nodes.
Values are read over about a second, so a sample is not one instant. Each hash is read
atomically, though (a whole one when it is small), and ``ts`` is taken after the last read. So
every lock and access time in a sample is at or before ``ts``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import Settings, parse_duration, redact_url
from ..core.snapshot_format import (
    COLUMNS,
    COMPRESSION,
    SCHEMA,
    file_path,
    table_from_columns,
    table_from_rows,
)
from ..files import fsync_path
from ..store import Scanner, ScanStats, lua_number

#: The ``broker`` column when nothing else says: the gateway's default adapter (``--broker`` and
#: ``MQGW_BROKER`` choose another).
DEFAULT_BROKER = Settings().broker
#: SCAN / HSCAN COUNT, and commands per pipeline round trip (see the module docstring).
SCAN_COUNT = 1000
CHUNK = 100
#: What :func:`write_snapshot_rows` fills in for a column a row leaves out.
_ROW_DEFAULTS = {"broker": DEFAULT_BROKER, "paused": False, "registered": False}
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


# -- Redis ----------------------------------------------------------------------------------------

def connect(url: str) -> Scanner:
    """The sampler's own Redis reader (``redis+cluster://`` for Redis Cluster), with timeouts, so a
    hung server cannot wedge the sampler, and a client name in CLIENT LIST."""
    return Scanner.connect(url, client_name="mqgw-snapshot")


_I64 = 1 << 63


async def collect(reader: Scanner, prefix: str = "mqgw", default_timeout_ms: int = 60_000,
                  now: int | None = None, broker: str = DEFAULT_BROKER,
                  ) -> tuple[int, dict[str, list[Any]], ScanStats]:
    """Read one sample: ``(ts_ms, columns, stats)``. ``columns`` has every name of :data:`SCHEMA`
    except ``ts``; rows are sorted by consumer, clientId, topic and queue."""
    sample = await reader.sample(prefix, count=SCAN_COUNT, chunk=CHUNK)
    ts = now if now is not None else int(time.time() * 1000)  # after every read: ages are >= 0

    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS if c != "ts"}
    per_group: dict[str, tuple[Any, ...]] = {}
    for g, cfg in sample.configs.items():
        timeout = lua_number(cfg.get("consume_timeout_ms"))
        rate = lua_number(cfg.get("rate"))
        # the bucket as choose.lua would refill it now, on Redis' clock (bucket_level.lua)
        tokens = sample.tokens.get(g) if rate is not None and rate > 0 else None
        if rate is not None and rate <= 0:
            rate = None
        if timeout is not None:  # a hand-edited 1e30 still means "never expires", in int64
            timeout = min(max(timeout, 0), _I64 - 1)
        per_group[g] = (int(timeout) if timeout is not None else default_timeout_ms,
                        cfg.get("paused") == "1", cfg.get("registered") == "1", rate, tokens)
    for h in sample.hashes:
        g, client = h.consumer, h.client_id
        timeout, paused, registered, rate, tokens = per_group[g]
        for q in h.queues:
            lo, hi = sample.watermarks.get(q.topic, {}).get(q.queue, (None, None))
            cols["consumer"].append(g)
            cols["client_id"].append(client)
            cols["mode"].append("broadcast" if client else "cluster")
            cols["broker"].append(broker)
            cols["topic"].append(q.topic)
            cols["queue"].append(q.queue)
            cols["max_offset"].append(max(q.max_offset, hi) if hi is not None else q.max_offset)
            cols["committed_offset"].append(q.committed)
            cols["low_watermark"].append(lo)
            cols["high_watermark"].append(hi)
            cols["lock_age_ms"].append(max(0, ts - q.lock_ms) if q.lock_ms else None)
            cols["lock_timeout_ms"].append(timeout)
            cols["last_access_ms"].append(q.access_ms or None)
            cols["paused"].append(paused)
            cols["registered"].append(registered)
            cols["rate_limit"].append(rate)
            cols["rate_tokens"].append(tokens)
            cols["last_poll_ms"].append(h.poll_ms)
    return ts, cols, sample.stats


# -- files ----------------------------------------------------------------------------------------

def snapshot_path(out_dir: str | os.PathLike[str], ts: int | dt.datetime) -> Path:
    """Where the sample taken at ``ts`` goes (before de-duplication of the name)."""
    return file_path(out_dir, ts, f"{_HOST}-{os.getpid()}")


def _open(path: str) -> BinaryIO:
    """The temporary file (a hook for tests that slow writing down)."""
    return open(path, "xb")


def write_table(table: pa.Table, out_dir: str | os.PathLike[str], ts: int | dt.datetime) -> Path:
    """Write one sample atomically: a dot-file in the target directory, fsync, rename, fsync the
    directory. Never replaces an existing file (a clash gets a ``-2``, ``-3`` … suffix)."""
    if not table.schema.equals(SCHEMA):
        raise ValueError(f"table schema differs from SCHEMA:\n{table.schema}")
    final = snapshot_path(out_dir, ts)
    final.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while final.exists():
        n += 1
        final = final.with_name(snapshot_path(out_dir, ts).stem + f"-{n}.parquet")
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        with _open(str(tmp)) as fh:
            pq.write_table(table, fh, compression=COMPRESSION)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_path(final.parent)
    return final


#: A temporary file this old was left by a writer that died (SIGKILL, power loss) mid-write: a
#: sample is written in seconds. Only then is it removed, so a writer on another host sharing
#: the directory is never disturbed.
ABANDONED_AFTER_S = 3600.0


def remove_abandoned(out_dir: str | os.PathLike[str], older_than_s: float = ABANDONED_AFTER_S,
                     now: float | None = None) -> list[Path]:
    """Delete ``.snap-*.tmp`` files older than ``older_than_s`` under ``out_dir``; return them.

    Readers skip dot-files anyway (Spark and pyarrow ignore names starting with ``.`` or
    ``_``); this only keeps crashed writes from piling up."""
    limit = (time.time() if now is None else now) - older_than_s
    removed = []
    for tmp in Path(out_dir).glob("date=*/hour=*/.snap-*.tmp"):
        try:
            if tmp.stat().st_mtime < limit:
                tmp.unlink()
                removed.append(tmp)
        except FileNotFoundError:  # another cleaner (or the writer) got there first
            pass
    return removed


def write_snapshot_rows(rows: list[dict[str, Any]], out_dir: str | os.PathLike[str],
                        ts: int | dt.datetime) -> Path:
    """Write rows (dicts keyed by :data:`SCHEMA` names, ``ts`` left out) as the sample taken at
    ``ts`` (epoch ms or an aware datetime): the same file, place and schema as ``mqgw
    snapshot``. E.g. for synthetic report inputs. Nullable columns may be left out, and so may
    ``client_id`` (""), ``mode`` (from client_id), ``broker``, ``paused`` and ``registered``
    (False); the others are required."""
    return write_table(table_from_rows(ts, rows, _ROW_DEFAULTS), out_dir, ts)


async def take(reader: Scanner, out_dir: str | os.PathLike[str], prefix: str = "mqgw",
               default_timeout_ms: int = 60_000, broker: str = DEFAULT_BROKER) -> dict[str, Any]:
    """Read one sample and write it; returns a summary (path, rows, bytes, timings, counts)."""
    ts, cols, stats = await collect(reader, prefix, default_timeout_ms, broker=broker)
    t0 = time.perf_counter()
    path = write_table(table_from_columns(ts, cols), out_dir, ts)
    return {"path": str(path), "ts": ts, "rows": len(cols["consumer"]), "bytes": path.stat().st_size,
            "queue_keys": stats.queue_keys, "consumers": stats.consumers, "topics": stats.topics,
            "pipelines": stats.pipelines, "pipelined_commands": stats.commands,
            "errors": stats.errors, "read_ms": stats.read_ms,
            "write_ms": round((time.perf_counter() - t0) * 1000)}


# -- command line ---------------------------------------------------------------------------------

def parse_interval(text: str) -> float:
    """``--every``: ``60s``, ``2m``, ``500ms``, ``1h`` or plain seconds (``90``, ``0.5``) ->
    seconds (:func:`gateway.config.parse_duration`, in units up to hours)."""
    return parse_duration(text, units=("ms", "s", "m", "h"))


def run(args: argparse.Namespace) -> int:
    """``mqgw snapshot``: exit 0 after --once or after SIGTERM/SIGINT, 1 if --once failed."""
    try:
        every = parse_interval(args.every)
    except ValueError as e:
        print(f"mqgw snapshot: {e}", file=sys.stderr)
        return 2
    settings = Settings.load()
    url = args.redis_url or settings.redis_url
    broker = getattr(args, "broker", None) or settings.broker  # --broker, else MQGW_BROKER
    return asyncio.run(_loop(url, args.out, every, args.once, args.verbose, settings.key_prefix,
                             settings.consume_timeout_ms, broker))


async def _loop(url: str, out: str, every: float, once: bool, verbose: bool, prefix: str,
                default_timeout_ms: int, broker: str = DEFAULT_BROKER) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    hits = 0

    def on_signal() -> None:  # first: finish the sample in progress; second: abandon it
        nonlocal hits
        hits += 1
        stop.set()
        if hits > 1 and main is not None:
            main.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    reader = connect(url)
    try:
        due = time.monotonic()
        swept = -math.inf
        while not stop.is_set():
            if time.monotonic() - swept >= ABANDONED_AFTER_S:  # at start, then hourly
                swept = time.monotonic()
                for tmp in remove_abandoned(out):
                    print(f"mqgw snapshot: removed abandoned {tmp}", file=sys.stderr, flush=True)
            try:
                summary = await take(reader, out, prefix, default_timeout_ms, broker)
            except Exception as e:  # noqa: BLE001 - Redis down, disk full: report, retry next interval
                print(f"mqgw snapshot: sample failed (Redis {redact_url(url)}): {e!r}",
                      file=sys.stderr, flush=True)
                if once:
                    return 1
            else:
                if once:
                    print(json.dumps(summary), flush=True)
                    return 0
                if verbose:
                    print(f"mqgw snapshot: {summary['rows']} rows in {summary['path']} "
                          f"(read {summary['read_ms']} ms, write {summary['write_ms']} ms)",
                          file=sys.stderr, flush=True)
            due += every
            now = time.monotonic()
            if due <= now:  # overran the interval: skip the missed ticks, keep the cadence
                due += math.ceil((now - due) / every) * every
            try:
                await asyncio.wait_for(stop.wait(), due - now)
            except TimeoutError:
                pass
        return 0
    except asyncio.CancelledError:
        return 0
    finally:
        await reader.aclose()
