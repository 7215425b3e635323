"""The report's Spark computations. Built-in Spark SQL and window functions only (no Python UDFs),
so the heavy part runs in the JVM on any cluster; Python only drives it.

Definitions (a *queue* is one (consumer, client_id, broker, topic, queue) series of samples, its
*span* the time from its first to its last sample inside the window):

- ``lag`` of a sample = max(max_offset - committed_offset, 0). The *current* lag is that of the
  queue's last sample.
- ``lag_slope`` (messages/s): the least-squares slope of lag against time (``regr_slope``); null
  with fewer than two samples. It is *beyond noise* when its t statistic (slope ÷ its standard
  error, from ``regr_r2``: t² = r²·(n−2)/(1−r²)) is at least :data:`TREND_T` (3) with n ≥ 3
  samples: a lag that only wobbles (a consumer keeping up is caught a few messages behind, more
  or fewer at each sample) has a slope of either sign that is not.
- ``consumption_rate`` (messages/s): the sum of the *positive* increments of committed_offset
  between consecutive samples, divided by the span. An offset reset that moves the committed
  offset back contributes 0 for that interval (no negative rate), and the messages read again
  afterwards count as consumed (they were delivered again). A reset *forward* cannot be told apart
  from fast consumption and is counted.
- ``production_rate`` (messages/s): a property of the *partition*, the same for every consumer
  that reads it, so one topic never shows two production figures. The partition's high watermark
  at a sample time is the highest ``max_offset`` / ``high_watermark`` of any of its rows then (the
  snapshotter writes max(the gateway's max offset, the listed watermark) for every reader); the
  rate is the sum of its positive increments between the partition's consecutive sample times,
  divided by the partition's span (its first to last sample time in the window, whoever's rows
  they were). A consumer's production is the sum over the partitions it reads, a topic's over its
  partitions: for a consumer that reads every partition, the same figure. ``produced`` stays the
  queue's own count (its max offset's positive increments over its own span).
- Both rates are null when the span is 0 (a single sample).
- ``noise_lag``: the lag a consumer that keeps up may show at a sample, the production of the
  queue's partition in one of its sample intervals (at least 1): it polls, commits, and by the
  next sample that much has arrived again. A lag that stays within it is small.
- ``drain_status``, from the lag's trend over the window, not from comparing two rates (their
  noise made a consumer at 101 % of production, lag 4, "never" on a partition read at 99 %):
  ``drained`` (lag 0); ``unknown`` (lag > 0, fewer than 3 samples: no trend to tell from noise);
  ``never`` (the lag grows: a slope beyond noise that added more than ``noise_lag`` over the
  span, the lag is above ``noise_lag`` now, and consumption is not above production);
  ``draining`` (a slope beyond noise that took more than ``noise_lag`` off, or one that added it
  while consumption is above production: the lag rose at a jump, such as an offset reset back,
  and is being read down); else ``steady`` (lag > 0 that neither grows nor shrinks beyond
  noise: a consumer keeping pace with production, or a fixed backlog; see stuck for one that
  does not move at all).
- ``drain_s``: 0 when drained; when draining, lag / (consumption_rate - production_rate), or
  lag / -lag_slope where the rates (a sum of increments over the span) do not show consumption
  ahead; null otherwise.
- ``stalled_s``: how long, up to the queue's last sample, the queue has had a backlog that its
  consumer did not reduce: the time from the first sample of the final run of samples that all
  have lag > 0 and the same committed offset as the last sample, to the last sample. It is
  measured between samples, so it errs short by less than one interval. 0 when the current lag
  is 0.
- ``stuck_backlog`` = stalled_s > --stuck-after; ``stuck_lock`` = the last sample's lock_age_ms >
  lock_timeout_ms (a lock held past the consume timeout); ``stuck`` = either.
- ``gone``: the queue is not in the window's last sample (its consumer was unregistered with its
  offsets, or its broadcast clientId expired). Its figures stay in the ``queues`` table, but it has
  no *current* lag: consumers, topics, stuck queues, the top-N and the heat map count only the
  queues that are still there.
- ``last_seen_ms``: the later of ``last_access_ms`` (the last lock or commit of a queue) and
  ``last_poll_ms`` (the last ``/message`` of the consumer or clientId, whatever it returned), so a
  consumer that keeps polling a quiet topic is seen.
- Idle: a consumer or clientId whose latest ``last_seen_ms`` (over all its queues and samples)
  is more than --idle-after before the end of the window (the last sample in it), or null.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gateway.core import snapshot_format

KEY = ["consumer", "client_id", "broker", "topic", "queue"]
#: A lag slope is beyond noise when its t statistic (slope ÷ standard error) reaches this. With
#: a lag that only wobbles, |t| >= 3 happens by chance in about 0.3 % of queues (n large), and
#: :func:`queue_stats` also wants the change to exceed the lag of one sample interval.
TREND_T = 3.0
WHO = ["consumer", "client_id"]

#: Spark's type for each Arrow type of the snapshot schema (a KeyError here, at import, names a
#: column type added to the format without a reader for it).
_SPARK_TYPES: dict[str, T.DataType] = {
    "timestamp[ms, tz=UTC]": T.TimestampType(), "string": T.StringType(), "int64": T.LongType(),
    "bool": T.BooleanType(), "double": T.DoubleType(),
}
#: The snapshot schema (:data:`gateway.core.snapshot_format.SCHEMA`) as Spark reads it: every
#: column nullable, as a file written before a column existed reads it as null.
INPUT_SCHEMA = T.StructType([T.StructField(f.name, _SPARK_TYPES[str(f.type)])
                             for f in snapshot_format.SCHEMA])

#: Spark settings the computations rely on (session time zone for timestamps, partition values
#: read as strings so ``date`` pruning compares 'YYYY-MM-DD' text).
SPARK_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # one snapshot file damaged by a copy or restore must not cost the whole report
    "spark.sql.files.ignoreCorruptFiles": "true",
}

_DAY = dt.timedelta(days=1)


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def read_samples(spark: SparkSession, path: str, since_ms: int | None = None,
                 until_ms: int | None = None, *, files: list[str] | None = None,
                 skip_topics: tuple[str, ...] = (),
                 skip_consumers: tuple[str, ...] = ()) -> DataFrame:
    """The samples in [since, until) with ``t_ms`` (epoch ms) and ``lag`` added, without the
    rows whose topic starts with one of ``skip_topics`` or consumer with one of
    ``skip_consumers`` (the gateway's internal ones, unless the report includes them).

    ``files``: the snapshot files to read under ``path`` (:func:`gateway.reports.inputs
    .window_files` found them), instead of every file under it. The ``date=`` directories are
    pruned to the window (with a day's slack on either side, in case a writer partitioned by
    local time); the exact cut is on ``ts``."""
    reader = spark.read.schema(INPUT_SCHEMA).option("basePath", path)
    df = reader.parquet(*files) if files else reader.parquet(path)
    partitioned = "date" in df.columns
    if since_ms is not None:
        if partitioned:
            df = df.where(F.col("date") >= (_utc(since_ms) - _DAY).strftime("%Y-%m-%d"))
        df = df.where(F.col("ts") >= F.lit(_utc(since_ms)))
    if until_ms is not None:
        if partitioned:
            df = df.where(F.col("date") <= (_utc(until_ms) + _DAY).strftime("%Y-%m-%d"))
        df = df.where(F.col("ts") < F.lit(_utc(until_ms)))
    for col, prefixes in (("topic", skip_topics), ("consumer", skip_consumers)):
        for prefix in prefixes:
            df = df.where(~F.col(col).startswith(prefix))
    cols = [f.name for f in INPUT_SCHEMA.fields]
    return df.select(
        *cols,
        F.unix_millis("ts").alias("t_ms"),
        F.greatest(F.col("max_offset") - F.col("committed_offset"), F.lit(0)).alias("lag"),
    ).where(F.col("ts").isNotNull())


PARTITION = ["broker", "topic", "queue"]


def partition_production(rows: DataFrame) -> DataFrame:
    """One row per partition (broker, topic, queue): ``production_rate`` from its high watermark
    over the window (see the module docstring), whichever consumers' rows carried it.

    Computed from every reader's rows together, not per queue: a consumer sampled over part of the
    window (it appeared late, or is sampled by another snapshotter at other times) must not see
    another production rate for the same topic than its neighbour."""
    mark = F.greatest(F.col("max_offset"), F.coalesce(F.col("high_watermark"), F.col("max_offset")))
    per_time = rows.groupBy(*PARTITION, "t_ms").agg(F.max(mark).alias("hw"))
    w = Window.partitionBy(*PARTITION).orderBy("t_ms")
    steps = per_time.select(*PARTITION, "t_ms", (F.col("hw") - F.lag("hw").over(w)).alias("d"))
    g = steps.groupBy(*PARTITION).agg(
        F.min("t_ms").alias("p_first_ms"), F.max("t_ms").alias("p_last_ms"),
        F.sum(F.greatest(F.col("d"), F.lit(0))).alias("p_produced"))
    span_ms = F.col("p_last_ms") - F.col("p_first_ms")
    return g.select(*PARTITION, F.when(span_ms > 0, F.col("p_produced") * F.lit(1000.0) / span_ms)
                    .alias("partition_rate"))


def sample_interval_ms(rows: DataFrame) -> float | None:
    """The median time between consecutive distinct sample times (what ``--every`` was, as
    observed), or None with fewer than two sample times. The distinct times are collected to the
    driver (8 bytes each: a year of 60 s samples is 4 MB), as a window over them without a
    partition would move them all to one partition anyway, with a warning on stderr."""
    import itertools
    import statistics

    times = sorted(rows.select("t_ms").distinct().toArrow().column("t_ms").to_pylist())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return float(statistics.median(gaps)) if gaps else None


def queue_stats(rows: DataFrame, stuck_after_ms: int) -> DataFrame:
    """One row per queue: current state, rates, slope, time to drain, stalls and locks. The
    production rate is the partition's (:func:`partition_production`), not the queue's own."""
    w = Window.partitionBy(*KEY).orderBy("t_ms")
    whole = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    x = rows.select(
        "*",
        (F.col("committed_offset") - F.lag("committed_offset").over(w)).alias("d_commit"),
        (F.col("max_offset") - F.lag("max_offset").over(w)).alias("d_max"),
        F.lead("t_ms").over(w).alias("next_ms"),
        F.last("committed_offset").over(whole).alias("final_committed"),
        F.first("t_ms").over(whole).alias("t0_ms"),
    )
    # A sample that ends a "backlog, no progress" run: no backlog, or another committed offset
    # than the last sample's. The run that counts starts right after the last such sample.
    breaks = ~((F.col("lag") > 0) & (F.col("committed_offset") == F.col("final_committed")))
    latest = F.max_by(F.struct(
        "mode", "max_offset", "committed_offset", "lag", "low_watermark", "high_watermark",
        "lock_age_ms", "lock_timeout_ms", "paused", "registered", "rate_limit", "rate_tokens",
    ), "t_ms")
    g = x.groupBy(*KEY).agg(
        F.min("t_ms").alias("first_ms"),
        F.max("t_ms").alias("last_ms"),
        F.count(F.lit(1)).alias("samples"),
        latest.alias("l"),
        F.sum(F.greatest(F.col("d_commit"), F.lit(0))).alias("consumed"),
        F.sum(F.greatest(F.col("d_max"), F.lit(0))).alias("produced"),
        F.regr_slope(F.col("lag").cast("double"),
                     (F.col("t_ms") - F.col("t0_ms")) / F.lit(1000.0)).alias("lag_slope"),
        F.regr_r2(F.col("lag").cast("double"),
                  (F.col("t_ms") - F.col("t0_ms")) / F.lit(1000.0)).alias("lag_r2"),
        F.max(F.when(breaks, F.struct("t_ms", "next_ms"))).alias("brk"),
        F.max("last_access_ms").alias("last_access_ms"),
        F.max("last_poll_ms").alias("last_poll_ms"),
    )
    span_ms = F.col("last_ms") - F.col("first_ms")

    def per_s(c: str) -> Column:
        return F.when(span_ms > 0, F.col(c) * F.lit(1000.0) / span_ms)

    # one row per partition: small next to the queues, so broadcast rather than shuffled
    g = g.join(F.broadcast(partition_production(rows)), PARTITION, "left")
    g = g.select(
        *KEY, "l.mode", "first_ms", "last_ms", "samples", (span_ms / F.lit(1000.0)).alias("span_s"),
        "l.max_offset", "l.committed_offset", "l.lag", "l.low_watermark", "l.high_watermark",
        F.col("lag_slope"), "lag_r2", F.col("partition_rate").alias("production_rate"),
        per_s("consumed").alias("consumption_rate"), "produced", "consumed",
        # no break at all: the whole span was a backlog without progress
        F.when(F.col("brk").isNull(), F.col("first_ms")).otherwise(F.col("brk.next_ms"))
        .alias("blocked_since_ms"),
        "l.lock_age_ms", "l.lock_timeout_ms", "l.paused", "l.registered", "l.rate_limit",
        "l.rate_tokens", "last_access_ms", "last_poll_ms",
        F.greatest("last_access_ms", "last_poll_ms").alias("last_seen_ms"),
    )
    lag, cons, prod = F.col("lag"), F.col("consumption_rate"), F.col("production_rate")
    n, slope, span = F.col("samples"), F.col("lag_slope"), F.col("span_s")
    # what the partition produces in one of this queue's sample intervals: a consumer that keeps
    # up can be that far behind at any sample
    per_interval = F.when(n > 1, F.coalesce(prod, F.lit(0.0)) * span / (n - 1))  # ANSI: no 0/0
    noise = F.greatest(F.lit(1.0), F.coalesce(per_interval, F.lit(0.0)))
    t2 = F.lit(TREND_T * TREND_T)
    # t >= TREND_T  <=>  r² (n - 2) >= T² (1 - r²); regr_r2 is 1 for a constant lag (slope 0)
    beyond_noise = (n >= 3) & (F.col("lag_r2") * (n - F.lit(2) + t2) >= t2)
    change = slope * span  # what the trend added over the span
    rose = beyond_noise & (slope > 0) & (change > noise) & (lag > noise)
    # the rates say which way it goes from here: a lag that rose at a jump (an offset reset
    # back) and is read down faster than produced drains
    growing = rose & ~(cons > prod)
    shrinking = (beyond_noise & (slope < 0) & (-change > noise)) | (rose & (cons > prod))
    stalled_ms = F.coalesce(F.col("last_ms") - F.col("blocked_since_ms"), F.lit(0))
    stuck_lock = F.coalesce(F.col("lock_age_ms") > F.col("lock_timeout_ms"), F.lit(False))
    return g.select(
        *KEY, "mode",
        F.timestamp_millis("first_ms").alias("first_ts"),
        F.timestamp_millis("last_ms").alias("last_ts"),
        "samples", "span_s", "max_offset", "committed_offset", "lag", "low_watermark",
        "high_watermark", "lag_slope", "production_rate", "consumption_rate", "produced",
        "consumed",
        noise.alias("noise_lag"),
        F.when(lag == 0, F.lit(0.0)).when(n < 3, None)
        .when(shrinking, F.when(cons > prod, lag / (cons - prod)).otherwise(lag / -slope))
        .alias("drain_s"),
        F.when(lag == 0, "drained").when(n < 3, "unknown").when(growing, "never")
        .when(shrinking, "draining").otherwise("steady").alias("drain_status"),
        (stalled_ms / F.lit(1000.0)).alias("stalled_s"),
        (stalled_ms > F.lit(stuck_after_ms)).alias("stuck_backlog"),
        "lock_age_ms", "lock_timeout_ms", stuck_lock.alias("stuck_lock"),
        ((stalled_ms > F.lit(stuck_after_ms)) | stuck_lock).alias("stuck"),
        "paused", "registered", "rate_limit", "rate_tokens", "last_access_ms", "last_poll_ms",
        "last_seen_ms", "first_ms", "last_ms",
    )


def mark_gone(queues: DataFrame, end_ms: int) -> DataFrame:
    """Add ``gone``: the queue's last sample is older than the window's last sample."""
    return queues.withColumn("gone", F.col("last_ms") < F.lit(end_ms))


def window_bounds(queues: DataFrame) -> dict[str, Any]:
    r = queues.agg(F.min("first_ms").alias("first_ms"), F.max("last_ms").alias("last_ms"),
                   F.sum("samples").alias("rows"), F.count(F.lit(1)).alias("queues")).first()
    return r.asDict() if r is not None else {}


def _idle(last_seen: Column, end_ms: int, idle_after_ms: int) -> tuple[Column, Column]:
    gap = F.lit(end_ms) - last_seen
    return (gap / F.lit(1000.0)).alias("idle_s"), \
        (last_seen.isNull() | (gap > F.lit(idle_after_ms))).alias("idle")


def _drain_rollup(lag: Column) -> tuple[Column, Column]:
    """A group of queues: ``never`` if the lag of any grows; else ``unknown`` if any has too few
    samples; ``drained`` with no lag; ``draining`` if any drains (in the time of its slowest
    draining queue; the steady ones keep a lag that does not grow); else ``steady``."""
    never = F.col("n_never") > 0
    unknown = F.col("n_unknown") > 0
    draining = F.col("n_draining") > 0
    status = (F.when(never, "never").when(unknown, "unknown").when(lag == 0, "drained")
              .when(draining, "draining").otherwise("steady"))
    drain = F.when(never | unknown, F.lit(None).cast("double")).when(lag == 0, F.lit(0.0)) \
        .when(draining, F.col("max_drain_s"))
    return drain.alias("drain_s"), status.alias("drain_status")


def _counts() -> list[Column]:
    return [
        F.sum(F.when(F.col("drain_status") == "never", 1).otherwise(0)).alias("n_never"),
        F.sum(F.when(F.col("drain_status") == "unknown", 1).otherwise(0)).alias("n_unknown"),
        F.sum(F.when(F.col("drain_status") == "draining", 1).otherwise(0)).alias("n_draining"),
        F.max("drain_s").alias("max_drain_s"),
        F.sum(F.col("stuck").cast("int")).alias("stuck_queues"),
    ]


def consumer_stats(queues: DataFrame, end_ms: int, idle_after_ms: int) -> DataFrame:
    """One row per (consumer, client_id): sums over its queues, drain, idleness."""
    g = queues.groupBy(*WHO).agg(
        F.max("mode").alias("mode"),
        F.count_distinct("broker", "topic").alias("topics"),
        F.count(F.lit(1)).alias("queues"),
        F.sum("lag").alias("lag"),
        F.sum("lag_slope").alias("lag_slope"),
        F.sum("production_rate").alias("production_rate"),
        F.sum("consumption_rate").alias("consumption_rate"),
        *_counts(),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
        F.max("last_access_ms").alias("last_access_ms"),
        F.max("last_poll_ms").alias("last_poll_ms"),
        F.max("last_seen_ms").alias("last_seen_ms"),
    )
    return g.select(
        *WHO, "mode", "topics", "queues", "lag", "lag_slope", "production_rate",
        "consumption_rate", *_drain_rollup(F.col("lag")), "stuck_queues", "first_ts", "last_ts",
        "last_access_ms", "last_poll_ms", "last_seen_ms",
        *_idle(F.col("last_seen_ms"), end_ms, idle_after_ms),
    )


def topic_stats(queues: DataFrame) -> DataFrame:
    """One row per (broker, topic). Production is counted once per partition (every queue of a
    partition carries the partition's rate, :func:`partition_production`); consumption, lag and
    slope are summed over every consumer and clientId reading the topic."""
    parts = queues.groupBy("broker", "topic", "queue").agg(
        F.max("production_rate").alias("production_rate"))
    prod = parts.groupBy("broker", "topic").agg(
        F.count(F.lit(1)).alias("partitions"), F.sum("production_rate").alias("production_rate"))
    rest = queues.groupBy("broker", "topic").agg(
        F.count_distinct(*WHO).alias("subscriptions"),
        F.sum("lag").alias("lag"),
        F.sum("lag_slope").alias("lag_slope"),
        F.sum("consumption_rate").alias("consumption_rate"),
        *_counts(),
    )
    return prod.join(rest, ["broker", "topic"]).select(
        "broker", "topic", "partitions", "subscriptions", "lag", "lag_slope", "production_rate",
        "consumption_rate", "stuck_queues", *_drain_rollup(F.col("lag")))


def subscription_stats(queues: DataFrame) -> DataFrame:
    """One row per (consumer, client_id, broker, topic): what each reader of a topic consumes,
    and whether its lag there grows (``drain_status``, as for a consumer)."""
    return queues.groupBy(*WHO, "broker", "topic").agg(
        F.sum("lag").alias("lag"),
        F.sum("consumption_rate").alias("consumption_rate"),
        F.sum("production_rate").alias("production_rate"),
        *_counts(),
    ).select(*WHO, "broker", "topic", "lag", "consumption_rate", "production_rate",
             *_drain_rollup(F.col("lag")))


def idle_stats(queues: DataFrame, consumers: DataFrame, end_ms: int,
               idle_after_ms: int) -> DataFrame:
    """Idle consumers (all their clientIds together) and idle broadcast clientIds."""
    whole = queues.groupBy("consumer").agg(
        F.max("mode").alias("mode"), F.sum("lag").alias("lag"),
        F.max("last_access_ms").alias("last_access_ms"), F.max("last_seen_ms").alias("last_seen_ms"),
        F.max("last_ts").alias("last_ts"),
    ).select(F.lit("consumer").alias("kind"), "consumer", F.lit("").alias("client_id"), "mode",
             "lag", "last_access_ms", "last_seen_ms", "last_ts",
             *_idle(F.col("last_seen_ms"), end_ms, idle_after_ms))
    clients = consumers.where(F.col("client_id") != "").select(
        F.lit("clientId").alias("kind"), "consumer", "client_id", "mode", "lag", "last_access_ms",
        "last_seen_ms", "last_ts", "idle_s", "idle")
    both = whole.unionByName(clients)
    return both.where("idle").drop("idle").select(
        "kind", "consumer", "client_id", "mode", "lag", "last_access_ms", "last_seen_ms",
        F.timestamp_millis("last_seen_ms").alias("last_seen"), "idle_s", "last_ts")


def stuck_stats(queues: DataFrame) -> DataFrame:
    reason = F.concat_ws(
        "+", F.when(F.col("stuck_backlog"), F.lit("no progress")),
        F.when(F.col("stuck_lock"), F.lit("lock expired")))
    return queues.where("stuck").select(
        *KEY, "mode", reason.alias("reason"), "lag", "stalled_s", "committed_offset",
        "max_offset", "lock_age_ms", "lock_timeout_ms", "paused", "consumption_rate",
        "production_rate", "last_ts")


# -- time series for the charts --------------------------------------------------------------------

def _bucketed(df: DataFrame, keys: list[str], start_ms: int, bucket_ms: int) -> DataFrame:
    """Per key and time bucket: the bucket's first and last sample times and its highest lag (the
    last time tells the heat map how long the gap to the next bucket's first sample is)."""
    b = F.floor((F.col("t_ms") - F.lit(start_ms)) / F.lit(bucket_ms)).alias("bucket")
    return df.groupBy(*keys, b).agg(F.min("t_ms").alias("t_ms"), F.max("t_ms").alias("last_ms"),
                                    F.max("lag").alias("lag"))


def total_lag_series(rows: DataFrame, start_ms: int, bucket_ms: int) -> DataFrame:
    per_sample = rows.groupBy("t_ms").agg(
        F.sum("lag").alias("lag"),
        F.sum(F.when(F.col("lag") > 0, 1).otherwise(0)).alias("queues_behind"))
    b = F.floor((F.col("t_ms") - F.lit(start_ms)) / F.lit(bucket_ms)).alias("bucket")
    return per_sample.groupBy(b).agg(
        F.min("t_ms").alias("t_ms"), F.max("lag").alias("lag"),
        F.max("queues_behind").alias("queues_behind"),
        F.count(F.lit(1)).alias("samples")).orderBy("t_ms")


def consumer_lag_series(rows: DataFrame, who: DataFrame, start_ms: int,
                        bucket_ms: int) -> DataFrame:
    """Total lag over time of the given (consumer, client_id)s (a small table, broadcast)."""
    per_sample = rows.join(F.broadcast(who.select(*WHO)), WHO) \
        .groupBy(*WHO, "t_ms").agg(F.sum("lag").alias("lag"))
    return _bucketed(per_sample, WHO, start_ms, bucket_ms).orderBy(*WHO, "t_ms")


def queue_lag_series(rows: DataFrame, keys: DataFrame, start_ms: int, bucket_ms: int) -> DataFrame:
    """Lag over time of the given queues (a small table, broadcast)."""
    picked = rows.join(F.broadcast(keys.select(*KEY)), KEY)
    return _bucketed(picked, KEY, start_ms, bucket_ms).orderBy(*KEY, "t_ms")


def queue_order() -> list[Column]:
    """Queues sort by consumer, clientId, broker, topic, then queue number (Kafka's partition
    number; RocketMQ's ``<broker>.<n>`` by its broker name, then n)."""
    return [F.col("consumer"), F.col("client_id"), F.col("broker"), F.col("topic"),
            F.expr("if(instr(queue, '.') > 0, substring_index(queue, '.', 1), '')"),
            F.expr("try_cast(substring_index(queue, '.', -1) AS BIGINT)").asc_nulls_last(),
            F.col("queue")]
