"""Prometheus metrics, correct across several uvicorn workers.

Each uvicorn worker is its own process, so an in-memory counter would only describe the
worker that happens to answer a scrape. With ``PROMETHEUS_MULTIPROC_DIR`` set (``mqgw serve``
sets it), prometheus-client keeps every value in a per-process mmap file in that directory,
and :func:`metrics_route` merges all the files, so any worker reports the node's totals.
prometheus-client picks its storage when it is first imported, so the variable must be in the
environment before that (``mqgw serve`` sets it before starting uvicorn).

Values that describe the *cluster* rather than this node (per-consumer backlog read from
Redis, alert gauges) must not be summed over workers: they are produced at scrape time by
hooks registered with :func:`add_collector_hook` and appended as they are.

The recording functions are called on hot paths, so label children are bound once and kept
in dicts; a call is a dict lookup and an increment.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable

import prometheus_client
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    multiprocess,
)
from prometheus_client import values as _values
from prometheus_client.metrics_core import Metric

__all__ = [
    "CONTENT_TYPE_LATEST", "acked", "add_collector_hook", "dependency_error", "fetched",
    "multiprocess_dir", "observe_request", "produced", "render", "shutdown",
]

log = logging.getLogger("mqgw.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: A scrape hook that takes longer than this (Redis down) is skipped so the scrape still answers.
HOOK_TIMEOUT_S = 5.0

# ``*_created`` series double the output and are not produced in multiprocess mode anyway;
# turning them off keeps single- and multi-process output the same shape.
prometheus_client.disable_created_metrics()

FETCH_STATUSES = ("ok", "empty", "paused", "rate_limited")
ACK_RESULTS = ("committed", "already_committed", "lock_lost", "offset_reset", "offset_mismatch",
               "unknown")
#: Ack results that mean the batch was stale: its lock or offsets changed after the fetch.
STALE_ACK_RESULTS = frozenset({"lock_lost", "offset_reset", "offset_mismatch"})
DEPENDENCIES = ("redis", "broker")
#: Methods outside this set are counted as ``other`` so a client cannot invent label values.
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})
#: Up to the 30 s long-poll cap and a little beyond.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0)

REQUESTS = Counter("mqgw_requests_total", "HTTP requests by route template, method and status",
                   ["route", "method", "status"])
REQUEST_DURATION = Histogram("mqgw_request_duration_seconds",
                             "HTTP request duration by route template (includes long-poll waits)",
                             ["route"], buckets=DURATION_BUCKETS)
PRODUCED = Counter("mqgw_produced_messages_total", "Records produced, by outcome", ["result"])
FETCHED = Counter("mqgw_fetched_messages_total", "Records handed out by /message")
FETCH_RESPONSES = Counter("mqgw_fetch_responses_total", "/message answers by status", ["status"])
ACKS = Counter("mqgw_acks_total", "Acks (including acks piggybacked on /message) by result",
               ["result"])
REDELIVERIES = Counter("mqgw_redeliveries_total",
                       "Batches handed out after a previous holder's lock expired")
STALE_ACKS = Counter("mqgw_stale_acks_total",
                     "Acks refused because the batch was stale (lock_lost, offset_reset, "
                     "offset_mismatch)")
DELAY_RECORDS = Counter("mqgw_delay_records_total", "Delayed records the relay moved: delivered "
                        "to their topic, hopped to the next level of the wheel, or dropped",
                        ["step"])
RETRIED = Counter("mqgw_failed_records_total", "Records consumers failed (/nack, or failed "
                  "offsets on /ack), by where they went", ["outcome"])
QUEUE_RESTORES = Counter("mqgw_offset_restores_total",
                         "Queues given their first committed offset in Redis by a restore: "
                         "resumed from the broker's checkpoint (after Redis lost them), or new "
                         "(their start position, written to the checkpoint first)", ["source"])
DEPENDENCY_ERRORS = Counter("mqgw_dependency_errors_total",
                            "Requests failed with 503 because Redis or the broker was unavailable",
                            ["dependency"])
CONNECTIONS_DROPPED = Counter("mqgw_connections_dropped_total",
                              "Connections the server ended on its own: head_timeout, body_timeout "
                              "(slow clients) and over_limit (refused: max_connections_per_worker)",
                              ["reason"])
#: Why the server (gateway/api/server.py) ends a connection on its own: a head or body too slow,
#: over the connection cap, a head too large, a client that takes no answer, too many pipelined.
DROP_REASONS = ("head_timeout", "body_timeout", "over_limit", "head_too_large", "write_timeout",
                "pipeline_full")

# Pre-bound children: creating them here also makes every series visible (at 0) from the start,
# so rate() and absent() queries behave before the first event.
_produced_ok = PRODUCED.labels("ok")
_produced_failed = PRODUCED.labels("failed")
_fetch_by_status = {s: FETCH_RESPONSES.labels(s) for s in FETCH_STATUSES}
_acks_by_result = {r: ACKS.labels(r) for r in ACK_RESULTS}
_delay_by_step = {s: DELAY_RECORDS.labels(s) for s in ("delivered", "hopped", "dropped")}
_failed_by_outcome = {o: RETRIED.labels(o) for o in ("retried", "dead_lettered")}
_dep_errors = {d: DEPENDENCY_ERRORS.labels(d) for d in DEPENDENCIES}
_dropped = {r: CONNECTIONS_DROPPED.labels(r) for r in DROP_REASONS}
# (route, method, status) -> (counter child, histogram child); bounded by routes x methods x codes.
_request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

CollectorHook = Callable[[], Awaitable[list[Metric]]]
_hooks: list[CollectorHook] = []


def _child(cache: dict[str, Counter], metric: Counter, value: str) -> Counter:
    c = cache.get(value)
    if c is None:  # a value the code added later; still bounded because callers pass constants
        c = cache[value] = metric.labels(value)
    return c


def produced(ok: int, failed: int) -> None:
    """Count records of one produce request that the broker acknowledged / that failed."""
    if ok:
        _produced_ok.inc(ok)
    if failed:
        _produced_failed.inc(failed)


def fetched(status: str, messages: int, redelivered: bool) -> None:
    """Count one /message answer (``ok``, ``empty``, ``paused``, ``rate_limited``)."""
    _child(_fetch_by_status, FETCH_RESPONSES, status).inc()
    if messages:
        FETCHED.inc(messages)
    if redelivered:
        REDELIVERIES.inc()


def delay_moved(step: str, n: int) -> None:
    """Count records the relay moved (``delivered``, ``hopped``, ``dropped``)."""
    _child(_delay_by_step, DELAY_RECORDS, step).inc(n)


def offsets_restored(resumed: int, new: int) -> None:
    """Count one restore's queues (core/checkpoint.py): ``resumed`` from the checkpoint, ``new``."""
    if resumed:
        QUEUE_RESTORES.labels(source="checkpoint").inc(resumed)
    if new:
        QUEUE_RESTORES.labels(source="start").inc(new)


def failed(retried: int, dead_lettered: int) -> None:
    """Count the records of one nack: sent to be retried, sent to the dead-letter topic."""
    if retried:
        _child(_failed_by_outcome, RETRIED, "retried").inc(retried)
    if dead_lettered:
        _child(_failed_by_outcome, RETRIED, "dead_lettered").inc(dead_lettered)


def acked(result: str) -> None:
    """Count one ack decision; stale results are also counted in ``mqgw_stale_acks_total``."""
    _child(_acks_by_result, ACKS, result).inc()
    if result in STALE_ACK_RESULTS:
        STALE_ACKS.inc()


def connection_dropped(reason: str) -> None:
    """A connection the server closed or refused on its own (see gateway/api/server.py)."""
    _dropped[reason].inc()


def dependency_error(dependency: str) -> None:
    """Count a request that failed because ``redis`` or ``broker`` was unavailable."""
    _child(_dep_errors, DEPENDENCY_ERRORS, dependency).inc()


def observe_request(route: str, method: str, status: int, seconds: float) -> None:
    """Record one HTTP request; ``route`` is a path template or ``unmatched``, never a raw path."""
    if method not in METHODS:
        method = "other"
    key = (route, method, status)
    children = _request_children.get(key)
    if children is None:
        children = _request_children[key] = (REQUESTS.labels(route, method, str(status)),
                                             REQUEST_DURATION.labels(route))
    children[0].inc()
    children[1].observe(seconds)


def add_collector_hook(fn: CollectorHook) -> None:
    """Add families computed at scrape time (``async def () -> list[Metric]``).

    For values that are the same on every node (read from Redis), so they are reported as
    they are and never summed over workers.
    """
    _hooks.append(fn)


def multiprocess_dir() -> str | None:
    """The multiprocess directory in use, or None when this process is the only one."""
    return os.environ.get(MULTIPROC_ENV) or None


class _Families:
    """Something :func:`prometheus_client.generate_latest` can render: it only calls collect()."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


_registry: CollectorRegistry | None = None


def _base_registry() -> CollectorRegistry:
    """All workers' files merged in multiprocess mode, else the process's default registry."""
    global _registry
    if _registry is None:
        if multiprocess_dir():
            if not getattr(_values.ValueClass, "_multiprocess", False):
                log.error("%s was set after prometheus_client was imported: this process's "
                          "metrics are missing from /metrics", MULTIPROC_ENV)
            _registry = CollectorRegistry(auto_describe=False)
            multiprocess.MultiProcessCollector(_registry)  # re-reads the directory on each collect
        else:
            _registry = prometheus_client.REGISTRY
    return _registry


async def _hook_families() -> list[Metric]:
    if not _hooks:
        return []
    results = await asyncio.gather(*(asyncio.wait_for(h(), HOOK_TIMEOUT_S) for h in _hooks),
                                   return_exceptions=True)
    out: list[Metric] = []
    for hook, res in zip(_hooks, results, strict=True):
        if isinstance(res, BaseException):
            log.warning("metrics hook %s failed: %r", getattr(hook, "__qualname__", hook), res)
        else:
            out.extend(res)
    return out


async def render() -> bytes:
    """The text exposition: this node's counters plus the hooks' families."""
    body = prometheus_client.generate_latest(_base_registry())
    extra = await _hook_families()
    if extra:
        body += prometheus_client.generate_latest(_Families(extra))
    return body


def shutdown() -> None:
    """Call when a worker stops: drops its live-gauge files (counters are kept, as they must be)."""
    path = multiprocess_dir()
    if path:
        multiprocess.mark_process_dead(os.getpid(), path)
