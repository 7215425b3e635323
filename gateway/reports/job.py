"""``mqgw report``: lag, rates, stuck and idle queues from ``mqgw snapshot`` files, with Spark.

Runs locally::

    mqgw report --snapshots DIR --out REPORT [--since ISO8601] [--until ISO8601] [--top 10]
                [--stuck-after 10m] [--idle-after 1h] [--include-internal] [--master local[*]]

and unchanged on a cluster (the package must be installed in the driver's Python)::

    PYSPARK_PYTHON=.venv/bin/python spark-submit --master spark://host:7077 \\
        gateway/reports/job.py --snapshots DIR --out REPORT ...

The window is [--since, --until) (UTC when no offset is given). DIR must be readable by every
executor (a shared filesystem, HDFS, S3); the results are small (one row per queue at most) and
are collected to the driver, which writes REPORT/ on its own filesystem:
``{queues,consumers,topics,stuck,idle,top}.{parquet,csv}``, ``report.html`` (self-contained),
``charts/*.png`` and ``summary.json``. Definitions: :mod:`gateway.reports.lag`.

The gateway's own topics (delay levels, retry topics: :func:`gateway.core.names
.internal_topic_prefixes` of the settings, ``MQGW_CONFIG`` and ``MQGW_*`` as for the gateway)
and consumers (``_mqgw…``, :data:`gateway.core.names.INTERNAL_PREFIX`) are left out unless
``--include-internal``: nobody produced to them, and 45 delay levels would bury two user topics.
A local DIR is checked for samples in the window in plain Python first
(:mod:`gateway.reports.inputs`): none, and the command says so without starting Spark.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # run as a file: spark-submit .../job.py
    _HERE = os.path.dirname(os.path.abspath(__file__))
    # This directory would shadow top-level modules; import the package by its full name.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        import gateway.reports  # noqa: F401
    except ImportError:  # a checkout that is not installed
        sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))

import argparse
import datetime as dt
import functools
import itertools
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.config import parse_duration
from gateway.reports import inputs

if TYPE_CHECKING:  # pyspark and pyarrow are imported when the command runs, not with this module
    import pyarrow as pa
    from pyspark.sql import SparkSession

TABLES = ("queues", "consumers", "topics", "stuck", "idle", "top")
LINE_POINTS = 300  # at most this many points per line in the time charts
HEAT_COLUMNS = 120  # at most this many time buckets in the heat map
HEAT_ROWS = 30  # queues in the heat map
RETIRED_CHARTS = ("topics",)  # charts/*.png of older versions, removed from an --out reused
#: A local run over less than this many bytes of snapshot files is nearly all fixed cost: JIT
#: compilation of Spark's own code, and code generation and adaptive re-planning of every query,
#: which pay off only on large inputs. Such a run starts the JVM with the quick (C1) JIT only and
#: the serial collector, and turns both off (issue 20, BENCHMARKS.md: 9,600 rows in 0.6 MB took
#: 54-62 s of CPU instead of 108 s). Measured on that size only, so the bound stays far below the
#: million-row runs of BENCHMARKS.md. ``--conf`` still overrides each setting.
SMALL_INPUT_BYTES = 8 << 20
SMALL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SMALL_INPUT_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false"}
LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")  # sc.setLogLevel's
#: One JSON object per line, the shape of the gateway's own log lines (gateway/ops/logs.py):
#: ts, level, logger, msg, exc (only with an exception).
_LOG_TEMPLATE = {
    "ts": {"$resolver": "timestamp",
           "pattern": {"format": "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'", "timeZone": "UTC"}},
    "level": {"$resolver": "level", "field": "name"},
    "logger": {"$resolver": "logger", "field": "name"},
    "msg": {"$resolver": "message", "stringified": True},
    "exc": {"$resolver": "exception", "field": "stackTrace", "stackTrace": {"stringified": True}},
}


def parse_time(text: str) -> int:
    """ISO 8601 (``2024-05-01``, ``2024-05-01T12:00``, ``...Z``, ``...+02:00``) -> epoch ms; no
    offset means UTC."""
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"invalid time {text!r}: use ISO 8601, e.g. 2024-05-01T12:00:00Z") \
            from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return round(t.timestamp() * 1000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--snapshots", required=True, metavar="DIR",
                   help="directory written by `mqgw snapshot` (date=/hour= partitions)")
    p.add_argument("--out", required=True, metavar="REPORT", help="output directory")
    p.add_argument("--since", metavar="ISO8601", help="window start (inclusive, UTC by default)")
    p.add_argument("--until", metavar="ISO8601", help="window end (exclusive)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="consumers in the ranking (10)")
    p.add_argument("--stuck-after", default="10m", metavar="DURATION",
                   help="backlog without progress for longer than this is stuck (10m)")
    p.add_argument("--idle-after", default="1h", metavar="DURATION",
                   help="no access for longer than this before the window's end is idle (1h)")
    p.add_argument("--include-internal", action="store_true",
                   help="also report the gateway's own topics (delay levels mqgw.delay.*, retry "
                        "topics mqgw.retry.*, ...) and consumers (_mqgw*), left out by default")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit, spark-submit's)")
    p.add_argument("--driver-memory", default="4g",
                   help="driver JVM heap when this command starts Spark itself (4g)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting (repeatable)")
    p.add_argument("--log-level", default="WARN", type=str.upper, choices=LOG_LEVELS,
                   help="Spark log level (WARN); its lines go to stderr as JSON, one per line")


def run(args: argparse.Namespace) -> int:
    try:
        opts = _options(args)
    except ValueError as e:
        print(f"mqgw report: {e}", file=sys.stderr)
        return 2
    if opts["files"] == []:  # a local directory without a sample in the window: no Spark
        print(f"mqgw report: no samples in {opts['snapshots']} within the window "
              f"({_window_text(opts)})", file=sys.stderr)
        return 2
    try:
        from pyspark.sql import SparkSession  # noqa: F401
    except ImportError:
        print("mqgw report: pyspark is missing; install the extra: "
              "pip install 'mq-gateway[reports]'", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    small = opts["input_bytes"] is not None and opts["input_bytes"] < SMALL_INPUT_BYTES
    with tempfile.TemporaryDirectory(prefix="mqgw-report-") as tmp:  # the log4j2 file, read at start
        spark = _session(args, Path(tmp), small)
    try:
        result = compute(spark, opts)
        if result is None:
            print(f"mqgw report: no samples in {opts['snapshots']} within the window "
                  f"({_window_text(opts)}){_internal_note(opts)}", file=sys.stderr)
            return 2
        result["summary"]["spark"] = {"version": spark.version,
                                      "master": spark.sparkContext.master,
                                      "app_id": spark.sparkContext.applicationId,
                                      "small_input": small}
    finally:
        spark.stop()
    result["summary"]["elapsed_s"] = round(time.perf_counter() - t0, 3)
    write(Path(opts["out"]), result)
    s = result["summary"]
    print(f"mqgw report: {s['counts']['rows']:,} rows, {s['counts']['queues']:,} queues, "
          f"{s['counts']['stuck']} stuck, {s['counts']['idle']} idle -> "
          f"{Path(opts['out']) / 'report.html'} ({s['elapsed_s']:.1f} s)")
    return 0


def _options(args: argparse.Namespace) -> dict[str, Any]:
    if args.top < 1:
        raise ValueError("--top must be at least 1")
    snapshots = args.snapshots
    if "://" not in snapshots:
        if not os.path.isdir(snapshots):
            raise ValueError(f"--snapshots {snapshots!r} is not a directory")
        # a URI, so that a cluster whose default filesystem is HDFS still reads this local path
        snapshots = Path(snapshots).resolve().as_uri()
    since = parse_time(args.since) if args.since else None
    until = parse_time(args.until) if args.until else None
    if since is not None and until is not None and until <= since:
        raise ValueError("--until must be after --since")
    stuck_after_ms = round(parse_duration(args.stuck_after) * 1000)
    idle_after_ms = round(parse_duration(args.idle_after) * 1000)
    local = inputs.local_dir(snapshots)
    found = None if local is None else inputs.window_files(local, since, until)
    return {"snapshots": snapshots, "out": args.out, "since_ms": since, "until_ms": until,
            "top": args.top, "stuck_after_ms": stuck_after_ms, "idle_after_ms": idle_after_ms,
            "files": None if found is None else [str(f) for f in found],
            "input_bytes": None if found is None else sum(f.stat().st_size for f in found),
            "internal": _internal(args.include_internal)}


def _internal(included: bool) -> dict[str, Any]:
    """The gateway's own topic and consumer prefixes (the rule of gateway.core.names), and
    whether the report includes them."""
    from gateway.config import Settings
    from gateway.core.names import INTERNAL_PREFIX, internal_topic_prefixes

    return {"included": included, "topic_prefixes": list(internal_topic_prefixes(Settings.load())),
            "consumer_prefixes": [INTERNAL_PREFIX]}


def _window_text(o: dict[str, Any]) -> str:
    return f"{_iso(o['since_ms']) or 'the first sample'} to {_iso(o['until_ms']) or 'the last'}"


def _internal_note(o: dict[str, Any]) -> str:
    i = o["internal"]
    return "" if i["included"] else \
        "; the gateway's internal topics and consumers are left out (--include-internal)"


def _log4j2(tmp: Path, level: str) -> Path:
    """The JVM's log4j2 configuration: every line to stderr as JSON (``_LOG_TEMPLATE``), at
    ``--log-level`` from the start. Without it Spark falls back to its own profile and prints,
    outside any log format, "Using Spark's default log4j profile", "Setting default log level
    to WARN" (pyspark counts as a shell) and its plain-text lines. The logger of pyspark's JVM
    entry point (PythonGatewayServer, the "shell") gets the root's level: Spark sets a shell's
    console to that logger's level (WARN unless configured), printing that banner when it
    differs from the root's. Two warnings that say nothing about a report (no native Hadoop
    library, a long plan's string truncated) are kept to errors."""
    path = tmp / "log4j2.properties"
    path.write_text(f"""\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = JsonTemplateLayout
appender.stderr.layout.eventTemplate = {json.dumps(_LOG_TEMPLATE, separators=(",", ":"))}
logger.shell.name = org.apache.spark.api.python.PythonGatewayServer
logger.shell.level = {level}
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.truncated.name = org.apache.spark.util.SparkStringUtils
logger.truncated.level = error
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
""")
    return path


def _session(args: argparse.Namespace, tmp: Path, small: bool = False) -> SparkSession:
    from pyspark.sql import SparkSession

    from gateway.reports import lag

    b = SparkSession.builder.appName("mqgw-report")
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM already
    if args.master:
        b = b.master(args.master)
    elif not submitted:
        b = b.master("local[*]")
    java_options = ""
    if not submitted:
        b = b.config("spark.driver.memory", args.driver_memory)
        java_options = f"-Dlog4j2.configurationFile={_log4j2(tmp, args.log_level).as_uri()}"
    loopback = (args.master or "local").startswith("local") and not submitted and \
        "SPARK_LOCAL_IP" not in os.environ  # one process: no reason to listen beyond loopback
    if small and not submitted and (args.master or "local").startswith("local"):
        java_options = f"{java_options} {SMALL_JVM_OPTIONS}".strip()
        for k, v in SMALL_INPUT_CONF.items():
            b = b.config(k, v)
    if loopback:
        b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for k, v in lag.SPARK_CONF.items():
        b = b.config(k, v)
    for kv in args.conf:
        k, sep, v = kv.partition("=")
        if not sep:
            raise SystemExit(f"mqgw report: --conf wants KEY=VALUE, not {kv!r}")
        if k.strip() == "spark.driver.extraJavaOptions":  # theirs after ours: a -D of theirs wins
            java_options, v = "", f"{java_options} {v.strip()}"
        b = b.config(k.strip(), v.strip())
    if java_options:
        b = b.config("spark.driver.extraJavaOptions", java_options)
    spark = _start(b, loopback)
    sc = spark.sparkContext
    sc.setLogLevel(args.log_level)
    if (sc.master or "").startswith("local") and not sc.getConf().contains("spark.sql.shuffle.partitions"):
        # Spark's 200 shuffle partitions cost ~20 ms each per stage on a few local cores and
        # dominate the many small aggregations here (1M rows: 78 s -> 26 s). A cluster keeps
        # the default (adaptive execution coalesces them) or takes --conf.
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, 2 * sc.defaultParallelism)))
    return spark


def _start(builder: SparkSession.Builder, loopback: bool) -> SparkSession:
    """Start the JVM. With a local master, SPARK_LOCAL_IP=127.0.0.1 in its environment: the JVM
    reads its own address from that variable before any setting, and without it warns, on a host
    whose name resolves to 127.0.x.x, "Your hostname ... resolves to a loopback address ... Set
    SPARK_LOCAL_IP", which is right for a cluster and noise for one process on one machine.
    The variable is set only while the JVM starts (it inherits it), then restored."""
    if not loopback:
        return builder.getOrCreate()
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    try:
        return builder.getOrCreate()
    finally:
        os.environ.pop("SPARK_LOCAL_IP", None)


def compute(spark: SparkSession, o: dict[str, Any]) -> dict[str, Any] | None:
    """Run the Spark part; returns the tables (pyarrow), the chart series and the summary."""
    from pyspark.sql import functions as F

    from gateway.reports import figures, lag, rates

    clock = _Clock()
    skip = o["internal"]
    rows = lag.read_samples(
        spark, o["snapshots"], o["since_ms"], o["until_ms"],
        # file:// and the path as it is: Hadoop reads a path's URI escapes as part of the name
        files=[f"file://{f}" for f in o["files"]] if o.get("files") else None,
        skip_topics=() if skip["included"] else tuple(skip["topic_prefixes"]),
        skip_consumers=() if skip["included"] else tuple(skip["consumer_prefixes"]))
    queues = lag.queue_stats(rows, o["stuck_after_ms"]).persist()
    b = lag.window_bounds(queues)
    clock("window")
    if not b.get("rows"):
        queues.unpersist()
        return None
    first_ms, end_ms = b["first_ms"], b["last_ms"]
    every = lag.mark_gone(queues, end_ms)
    live = every.where(~F.col("gone"))  # current figures count only queues still there
    consumers = lag.consumer_stats(live, end_ms, o["idle_after_ms"]).persist()
    by_lag = [F.desc("lag")]
    dfs = {
        "queues": every.drop("first_ms", "last_ms").orderBy(*lag.queue_order()),
        "consumers": consumers.orderBy(*by_lag, *lag.WHO),
        "topics": lag.topic_stats(live).orderBy(*by_lag, "broker", "topic"),
        "stuck": lag.stuck_stats(live).orderBy(F.desc("stalled_s"), *by_lag, *lag.queue_order()),
        "idle": lag.idle_stats(live, consumers, end_ms, o["idle_after_ms"]).orderBy(
            F.col("idle_s").desc_nulls_first(), "kind", *lag.WHO),
        "top": consumers.where(F.col("lag") > 0).orderBy(*by_lag, *lag.WHO).limit(o["top"]),
    }
    tables = {}
    for name, df in dfs.items():
        tables[name] = df.toArrow()
        clock(f"table_{name}")
    tables["top"] = _with_rank(tables["top"])
    readers = lag.subscription_stats(live).toArrow().to_pylist()
    clock("readers")

    span = end_ms - first_ms
    line_ms = max(1, math.ceil(span / LINE_POINTS))
    # The three time series read the samples again: cache just the columns they need once
    # (with thousands of small files, each scan costs far more than this cache).
    lean = rows.select(*lag.KEY, "t_ms", "lag").persist()
    total = lag.total_lag_series(lean, first_ms, line_ms).toArrow().to_pylist()
    clock("series_total")
    interval = lag.sample_interval_ms(lean)
    if interval is None:  # a single sample time
        gaps = [b2["t_ms"] - a["t_ms"] for a, b2 in itertools.pairwise(total)]
        interval = statistics.median(gaps) if gaps else 1
    clock("sample_interval")
    heat_ms = max(math.ceil(span / HEAT_COLUMNS), int(interval), 1)
    top_series = lag.consumer_lag_series(lean, dfs["top"], first_ms, line_ms).toArrow().to_pylist() \
        if tables["top"].num_rows else []
    clock("series_top")
    heat_keys = live.where(F.col("lag") > 0).orderBy(*by_lag, *lag.queue_order()).limit(HEAT_ROWS)
    heat_rows = heat_keys.select(*lag.KEY, "lag").toArrow().to_pylist()
    heat = lag.queue_lag_series(lean, heat_keys, first_ms, heat_ms).toArrow().to_pylist() \
        if heat_rows else []
    clock("series_heat")
    for df in (lean, consumers, queues):
        df.unpersist()
    result_heat = {"first_ms": first_ms, "heat_ms": heat_ms, "span_ms": span, "heat": heat,
                   "heat_rows": heat_rows, "interval_ms": interval}
    heat_grid = figures.heat_grid(result_heat)

    q = tables["queues"]
    counts = {
        "rows": int(b["rows"]), "queues": q.num_rows,
        "samples": sum(r["samples"] for r in total),  # distinct sample times
        "consumers": tables["consumers"].num_rows,
        "topics": tables["topics"].num_rows,
        "stuck": tables["stuck"].num_rows, "idle": tables["idle"].num_rows,
        "gone": sum(q.column("gone").to_pylist()),
        "never": sum(1 for s, g in zip(q.column("drain_status").to_pylist(),
                                       q.column("gone").to_pylist(), strict=True)
                     if s == "never" and not g),
        # consumers/clientIds whose lag grows beyond noise (rates.behind)
        "behind": sum(1 for r in tables["consumers"].to_pylist() if rates.behind(r)),
    }
    topics = tables["topics"]
    totals = {
        "lag": _sum(topics, "lag"), "lag_slope": _sum(topics, "lag_slope"),
        "production_rate": _sum(topics, "production_rate"),
        "consumption_rate": _sum(topics, "consumption_rate"),
    }
    summary = {
        "generated_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "snapshots": o["snapshots"],
        "window": {
            "since": _iso(o["since_ms"]), "until": _iso(o["until_ms"]),
            "first_sample": _iso(first_ms), "last_sample": _iso(end_ms), "span_s": span / 1000,
        },
        "thresholds": {"stuck_after_s": o["stuck_after_ms"] / 1000,
                       "idle_after_s": o["idle_after_ms"] / 1000, "top": o["top"]},
        "internal": o["internal"],
        "files": len(o["files"]) if o.get("files") is not None else None,
        "counts": counts,
        "totals": totals,
        "buckets": {"line_s": line_ms / 1000, "heat_s": heat_ms / 1000,
                    "sample_interval_s": interval / 1000},
        "heatmap": figures.heat_summary(result_heat, heat_grid[1]),
        "timings_s": clock.laps,
        "top": _jsonable(tables["top"].to_pylist()),
        "stuck": _jsonable(tables["stuck"].to_pylist()[:100]),
        "idle": _jsonable(tables["idle"].to_pylist()[:100]),
    }
    return {"tables": tables, "summary": summary, "readers": readers, "total": total,
            "top_series": top_series, **result_heat, "heat_grid": heat_grid}


class _Clock:
    """Seconds spent per step (each step ends with the Spark action that runs it)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._t, 3)
        self._t = now


def _with_rank(t: pa.Table) -> pa.Table:
    import pyarrow as pa

    return t.add_column(0, "rank", pa.array(range(1, t.num_rows + 1), pa.int32()))


def _sum(t: pa.Table, col: str) -> float | None:
    vals = [v for v in t.column(col).to_pylist() if v is not None]
    total: float = sum(vals)
    return total if vals else None


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _jsonable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        out.append({k: (v.isoformat().replace("+00:00", "Z") if isinstance(v, dt.datetime) else v)
                    for k, v in r.items()})
    return out


def write(out: Path, result: dict[str, Any]) -> None:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from gateway.reports import figures, render

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for name, t in result["tables"].items():
        _atomic(out / f"{name}.parquet", functools.partial(pq.write_table, t))
        _atomic(out / f"{name}.csv", functools.partial(pacsv.write_csv, t))
    charts = figures.charts(result)
    (out / "charts").mkdir(exist_ok=True)
    for name, chart in charts.items():
        if chart:
            _atomic(out / "charts" / f"{name}.png", functools.partial(_write_bytes, chart.png))
        else:  # no such chart this time: an earlier run's must not pass for this one's
            (out / "charts" / f"{name}.png").unlink(missing_ok=True)
    for name in RETIRED_CHARTS:  # drawn by an older version: not this run's
        (out / "charts" / f"{name}.png").unlink(missing_ok=True)
    result["summary"]["charts"] = figures.layout(charts)
    result["summary"].setdefault("timings_s", {})["tables_and_charts"] = \
        round(time.perf_counter() - t0, 3)
    tables = {k: result["tables"][k].to_pylist()
              for k in ("stuck", "top", "topics", "idle", "consumers")}
    tables["readers"] = result["readers"]
    page = render.page(result["summary"], tables,
                       {k: (c.png if c else None) for k, c in charts.items()})
    _atomic(out / "report.html", lambda p: Path(p).write_text(page, encoding="utf-8"))
    _atomic(out / "summary.json",
            lambda p: Path(p).write_text(json.dumps(result["summary"], indent=2, default=str)
                                         + "\n", encoding="utf-8"))


def _write_bytes(data: bytes, path: str) -> None:
    Path(path).write_bytes(data)


def _atomic(path: Path, write_fn: Callable[[str], object]) -> None:
    """Write through a dot-file in the same directory: fsync, rename, fsync the directory. A
    reader sees the old file or the new one, never a torn one, also after a power loss."""
    from gateway.files import fsync_path  # absolute: spark-submit runs this file as a script

    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write_fn(str(tmp))
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mqgw report", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
