"""``mqgw snapshot``: sample every consumer's queue state from Redis into Parquet files.

One sample is one file with one row per (time, consumer, clientId, broker, topic, queue), laid
out for Spark's partition discovery::

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

**Reading Redis without hurting it.** Only bounded commands are used:

1. ``SCAN <cursor> MATCH P:{*}:q* COUNT 1000``. It walks the keyspace in steps of ~1000 slots
   (every primary on Redis Cluster), finding cluster-mode queue hashes ``P:{G}:q`` and broadcast
   ones ``P:{G}:q:<clientId>``.
2. ``HSCAN <key> 0 COUNT 1000`` for each queue hash and each topic's watermark hash. A hash of up
   to 128 fields (21 queues) comes back whole from that one call, just as HGETALL would. A larger
   one is continued with its cursor in the next pipeline. So no single reply grows with the number
   of queues a consumer has, as an HGETALL's would. (On such small hashes HSCAN costs about 7 µs
   against HGETALL's 4.5 µs.)
3. ``HGETALL`` of each consumer's ``P:{G}:cfg`` and ``P:{G}:rl``. The registry bounds those to a
   few dozen fields.

There is no KEYS, no Lua and no MULTI. Pipelines hold :data:`CHUNK` (100) commands. Redis runs
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import redact_url
from ..files import fsync_path
from ..store import QueueState, parse_queue_hash

#: The file schema: a contract with the report job (``mqgw report``). Add columns at the end only.
SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("ms", tz="UTC"), nullable=False),  # sample time, same for all rows
        pa.field("consumer", pa.string(), nullable=False),
        pa.field("client_id", pa.string(), nullable=False),  # "" in cluster mode
        pa.field("mode", pa.string(), nullable=False),  # "cluster" | "broadcast"
        pa.field("broker", pa.string(), nullable=False),  # "kafka"
        pa.field("topic", pa.string(), nullable=False),
        pa.field("queue", pa.string(), nullable=False),  # partition number as a string
        pa.field("max_offset", pa.int64(), nullable=False),  # max(stored max, watermark hi)
        pa.field("committed_offset", pa.int64(), nullable=False),
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
        pa.field("last_poll_ms", pa.int64()),
    ],
    metadata={"mqgw.snapshot.version": "2"},
)
COLUMNS = SCHEMA.names
BROKER = "kafka"
#: Parquet compression. Spark 3 reads zstd natively.
COMPRESSION = "zstd"
#: SCAN / HSCAN COUNT, and commands per pipeline round trip (see the module docstring).
SCAN_COUNT = 1000
CHUNK = 100
DEFAULT_DIR = "snapshots"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


# -- Redis ----------------------------------------------------------------------------------------

def connect(url: str) -> Any:
    """Like ``gateway.app.connect_redis`` (``redis+cluster://`` for Redis Cluster), but with
    timeouts, so a hung server cannot wedge the sampler, and a client name in CLIENT LIST."""
    kw: dict[str, Any] = {"decode_responses": True, "socket_timeout": 30,
                          "socket_connect_timeout": 10, "client_name": "mqgw-snapshot"}
    if url.startswith("redis+cluster://"):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url("redis://" + url[len("redis+cluster://"):], **kw)
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(url, **kw)


@dataclass
class Stats:
    queue_keys: int = 0
    consumers: int = 0
    topics: int = 0
    pipelines: int = 0
    commands: int = 0  # pipelined commands (the SCANs are not counted)
    errors: int = 0  # replies that were errors (e.g. a key that is not a hash)
    read_ms: int = 0


def _glob(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def queue_key_pattern(prefix: str) -> str:
    """The SCAN MATCH pattern of every consumer queue hash."""
    return _glob(prefix) + ":{*}:q*"


def _queue_key_re(prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + r":\{([^{}:]+)\}:q(?::([^:{}]+))?")


async def _pipelined(redis: Any, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]],
                     stats: Stats) -> list[Any]:
    """Run ``(method, args, kwargs)`` calls in non-transactional pipelines of :data:`CHUNK`."""
    out: list[Any] = []
    for i in range(0, len(calls), CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for name, args, kwargs in calls[i:i + CHUNK]:
                getattr(pipe, name)(*args, **kwargs)
            out.extend(await pipe.execute(raise_on_error=False))
        stats.pipelines += 1
        stats.commands += len(calls[i:i + CHUNK])
    return out


async def _read_hashes(redis: Any, keys: list[str], stats: Stats) -> list[dict[str, str]]:
    """Every field of each hash via HSCAN COUNT 1000: small hashes in one call, big ones in
    bounded steps (continued in later pipelines)."""
    result: list[dict[str, str]] = [{} for _ in keys]
    todo = [(i, 0) for i in range(len(keys))]
    while todo:
        replies = await _pipelined(
            redis, [("hscan", (keys[i], cur), {"count": SCAN_COUNT}) for i, cur in todo], stats)
        nxt = []
        for (i, _), r in zip(todo, replies):
            if isinstance(r, Exception):
                stats.errors += 1
                continue
            cursor, data = r
            result[i].update(data)
            if int(cursor):
                nxt.append((i, int(cursor)))
        todo = nxt
    return result


async def _get_all(redis: Any, keys: list[str], stats: Stats) -> list[dict[str, str]]:
    out = []
    for r in await _pipelined(redis, [("hgetall", (k,), {}) for k in keys], stats):
        if isinstance(r, Exception):
            stats.errors += 1
            r = {}
        out.append(r)
    return out


def _num(v: str | None) -> float | None:
    """Lua's ``tonumber``, for the values the scripts read with it."""
    if v is None:
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


_I64 = 1 << 63


def _parse(fields: dict[str, str], stats: Stats) -> list[QueueState]:
    """The hash's queues, minus any that cannot be a real state.

    choose.lua writes a queue's ``max`` and ``com`` together (a reset to 0 of a queue never read
    writes ``com`` alone), so a queue without ``com``, or without ``max`` above 0, was read half:
    its hash was deleted (unregister, an expired clientId) between two HSCAN rounds. Defaulting
    the missing field to 0 would report a phantom lag (and a phantom rate in the next sample), so
    such queues are left out. A value outside int64 (a hand-edited hash) skips the whole hash
    rather than lose the whole sample."""
    try:
        states = parse_queue_hash(fields)
    except ValueError:
        stats.errors += 1
        return []
    if any(not -_I64 <= v < _I64 for q in states
           for v in (q.max_offset, q.committed, q.lock_ms, q.access_ms)):
        stats.errors += 1
        return []
    return [q for q in states if f"{q.topic}:{q.queue}:com" in fields
            and (q.committed == 0 or f"{q.topic}:{q.queue}:max" in fields)]


async def collect(redis: Any, prefix: str = "mqgw", default_timeout_ms: int = 60_000,
                  now: int | None = None) -> tuple[int, dict[str, list[Any]], Stats]:
    """Read one sample: ``(ts_ms, columns, stats)``. ``columns`` has every name of :data:`SCHEMA`
    except ``ts``; rows are sorted by consumer, clientId, topic and queue."""
    t0 = time.perf_counter()
    stats = Stats()
    key_re = _queue_key_re(prefix)
    found: dict[str, tuple[str, str]] = {}  # key -> (group, clientId); SCAN may repeat keys
    async for key in redis.scan_iter(match=queue_key_pattern(prefix), count=SCAN_COUNT):
        m = key_re.fullmatch(key)
        if m:
            found[key] = (m.group(1), m.group(2) or "")
    keys = sorted(found, key=lambda k: found[k])
    groups = sorted({g for g, _ in found.values()})
    stats.queue_keys, stats.consumers = len(keys), len(groups)

    hashes = await _read_hashes(redis, keys, stats)
    side = await _get_all(redis, [f"{prefix}:{{{g}}}:{s}" for g in groups for s in ("cfg", "rl")], stats)
    cfgs = {g: side[2 * i] for i, g in enumerate(groups)}
    buckets = {g: side[2 * i + 1] for i, g in enumerate(groups)}
    states = [_parse(h, stats) for h in hashes]
    topics = sorted({q.topic for st in states for q in st})
    stats.topics = len(topics)
    wms = dict(zip(topics, await _read_hashes(redis, [f"{prefix}:{{wm:{t}}}" for t in topics], stats)))
    ts = now if now is not None else int(time.time() * 1000)  # after every read: ages are >= 0
    # Locks are stamped with the nodes' clocks, but the rate-limit bucket runs on Redis' clock
    # (choose.lua): refill it to Redis' time, or a skewed snapshot host misstates its tokens.
    sec, usec = await redis.time()
    stats.commands += 1
    bucket_now = int(sec) * 1000 + int(usec) // 1000
    stats.read_ms = round((time.perf_counter() - t0) * 1000)

    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS if c != "ts"}
    per_group: dict[str, tuple[Any, ...]] = {}
    for g in groups:
        cfg = cfgs[g]
        timeout = _num(cfg.get("consume_timeout_ms"))
        rate = _num(cfg.get("rate"))
        tokens = None
        if rate is not None and rate > 0:  # as choose.lua refills the bucket, at time ts
            burst = _num(cfg.get("burst"))
            burst = max(math.floor(rate), 1) if burst is None else burst
            b = buckets[g]
            tokens = _num(b.get("tokens"))
            tokens = burst if tokens is None else tokens
            last = _num(b.get("ts"))
            last = bucket_now if last is None else last
            if bucket_now > last:
                tokens = min(burst, tokens + (bucket_now - last) * rate / 1000)
            tokens = float(tokens)
        else:
            rate = None
        if timeout is not None:  # a hand-edited 1e30 still means "never expires", in int64
            timeout = min(max(timeout, 0), _I64 - 1)
        per_group[g] = (int(timeout) if timeout is not None else default_timeout_ms,
                        cfg.get("paused") == "1", cfg.get("registered") == "1", rate, tokens)
    for key, st, fields in zip(keys, states, hashes):
        g, client = found[key]
        timeout, paused, registered, rate, tokens = per_group[g]
        poll = _num(fields.get("poll"))
        poll = int(poll) if poll is not None and 0 < poll < _I64 else None
        for q in st:
            wm = wms.get(q.topic, {})
            lo, hi = wm.get(f"{q.queue}:lo"), wm.get(f"{q.queue}:hi")
            lo = int(lo) if lo is not None and lo.lstrip("-").isdigit() else None
            hi = int(hi) if hi is not None and hi.lstrip("-").isdigit() else None
            cols["consumer"].append(g)
            cols["client_id"].append(client)
            cols["mode"].append("broadcast" if client else "cluster")
            cols["broker"].append(BROKER)
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
            cols["last_poll_ms"].append(poll)
    return ts, cols, stats


# -- files ----------------------------------------------------------------------------------------

def _ts_ms(ts: float | dt.datetime) -> int:
    if isinstance(ts, dt.datetime):
        if ts.tzinfo is None:
            raise ValueError("ts must be timezone-aware (UTC)")
        return (ts - _EPOCH) // dt.timedelta(milliseconds=1)
    return int(ts)


def snapshot_path(out_dir: str | os.PathLike[str], ts: int | dt.datetime) -> Path:
    """Where the sample taken at ``ts`` goes (before de-duplication of the name)."""
    t = dt.datetime.fromtimestamp(_ts_ms(ts) / 1000, dt.UTC)
    stamp = t.strftime("%Y%m%dT%H%M%S") + f"{_ts_ms(ts) % 1000:03d}"
    return (Path(out_dir) / f"date={t:%Y-%m-%d}" / f"hour={t:%H}"
            / f"snap-{stamp}-{_HOST}-{os.getpid()}.parquet")


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


def table_from_columns(ts: int | dt.datetime, cols: dict[str, list[Any]]) -> pa.Table:
    n = len(cols["consumer"])
    arrays = [pa.array([_ts_ms(ts)] * n, SCHEMA.field("ts").type)]
    arrays += [pa.array(cols[c], SCHEMA.field(c).type) for c in COLUMNS[1:]]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def write_snapshot_rows(rows: list[dict[str, Any]], out_dir: str | os.PathLike[str],
                        ts: int | dt.datetime) -> Path:
    """Write rows (dicts keyed by :data:`SCHEMA` names, ``ts`` left out) as the sample taken at
    ``ts`` (epoch ms or an aware datetime): the same file, place and schema as ``mqgw
    snapshot``. E.g. for synthetic report inputs. Nullable columns may be left out, and so may
    ``client_id`` (""), ``mode`` (from client_id), ``broker``, ``paused`` and ``registered``
    (False); the others are required."""
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS[1:]}
    for r in rows:
        extra = set(r) - set(COLUMNS[1:])
        if extra:
            raise ValueError(f"unknown column(s): {sorted(extra)}")
        client = r.get("client_id", "")
        defaults = {"client_id": client, "mode": "broadcast" if client else "cluster",
                    "broker": BROKER, "paused": False, "registered": False}
        for c in COLUMNS[1:]:
            v = r.get(c, defaults.get(c))
            if v is None and not SCHEMA.field(c).nullable:
                raise ValueError(f"column {c!r} may not be null: {r}")
            cols[c].append(v)
    return write_table(table_from_columns(ts, cols), out_dir, ts)


async def take(redis: Any, out_dir: str | os.PathLike[str], prefix: str = "mqgw",
               default_timeout_ms: int = 60_000) -> dict[str, Any]:
    """Read one sample and write it; returns a summary (path, rows, bytes, timings, counts)."""
    ts, cols, stats = await collect(redis, prefix, default_timeout_ms)
    t0 = time.perf_counter()
    path = write_table(table_from_columns(ts, cols), out_dir, ts)
    return {"path": str(path), "ts": ts, "rows": len(cols["consumer"]), "bytes": path.stat().st_size,
            "queue_keys": stats.queue_keys, "consumers": stats.consumers, "topics": stats.topics,
            "pipelines": stats.pipelines, "pipelined_commands": stats.commands,
            "errors": stats.errors, "read_ms": stats.read_ms,
            "write_ms": round((time.perf_counter() - t0) * 1000)}


# -- command line ---------------------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_interval(text: str) -> float:
    """``60s``, ``2m``, ``500ms``, ``1h`` or plain seconds (``90``, ``0.5``) -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"invalid interval {text!r}: use e.g. 60s, 2m, 500ms or plain seconds")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def run(args: argparse.Namespace) -> int:
    """``mqgw snapshot``: exit 0 after --once or after SIGTERM/SIGINT, 1 if --once failed."""
    from ..config import Settings

    try:
        every = parse_interval(args.every)
    except ValueError as e:
        print(f"mqgw snapshot: {e}", file=sys.stderr)
        return 2
    settings = Settings.load()
    url = args.redis_url or settings.redis_url
    return asyncio.run(_loop(url, args.out, every, args.once, args.verbose, settings.key_prefix,
                             settings.consume_timeout_ms))


async def _loop(url: str, out: str, every: float, once: bool, verbose: bool, prefix: str,
                default_timeout_ms: int) -> int:
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
    redis = connect(url)
    try:
        due = time.monotonic()
        swept = -math.inf
        while not stop.is_set():
            if time.monotonic() - swept >= ABANDONED_AFTER_S:  # at start, then hourly
                swept = time.monotonic()
                for tmp in remove_abandoned(out):
                    print(f"mqgw snapshot: removed abandoned {tmp}", file=sys.stderr, flush=True)
            try:
                summary = await take(redis, out, prefix, default_timeout_ms)
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
        await redis.aclose()
