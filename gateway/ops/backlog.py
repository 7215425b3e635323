"""Backlog of every consumer: per queue (and broadcast clientId) the records not yet committed,
and how old the oldest of them is.

Everything is read from Redis in a few pipelined round trips whatever the number of consumers
(``OffsetStore.read_consumers``: configs, queue hashes and clientId sets; then the clientIds'
hashes; then one watermark read per topic). ``maxOffset`` is the larger of the consumer's
stored max and the topic's shared watermarks (``core/views.py``, as ``GET
/consumers/{c}/queues`` computes it); when those are older than ``metadata_refresh_ms`` the
usual lease lets one process refresh them from the broker (``Watermarks.shared``), so the
backlog of a topic nobody reads any more keeps growing in the view instead of freezing. The
age needs one broker read per queue with a backlog: the record at the committed offset, whose
timestamp says how long it has been waiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..broker import Record
from ..core.views import queue_row
from ..core.watermarks import Stamped, Watermarks
from ..store import QueueState, now_ms

log = logging.getLogger("mqgw.backlog")

#: Concurrent broker reads for ages, per call.
PEEK_CONCURRENCY = 8
PEEK_TIMEOUT_S = 5.0
#: All peeks of one view or alert evaluation together: well inside the alert lock's 30 s, so an
#: evaluation never outlives its lock (and gets dropped) because the broker is slow.
PEEK_BUDGET_S = 10.0
#: Figures older than this (or five refresh intervals) are called stale: the consume path and
#: the views refresh the shared watermarks every ``metadata_refresh_ms``, so a copy this old
#: means the broker has not been answering.
STALE_AFTER_MS = 10_000

AgeWanted = bool | Callable[[dict[str, str]], bool]


async def collect(gw: Any, consumers: list[str] | None = None,
                  with_age: AgeWanted = True) -> list[dict[str, Any]]:
    """One entry per consumer (registered ∪ seen, or ``consumers``), sorted by name.

    ``with_age`` may also be a predicate on the consumer's config hash (the alert monitor only
    asks for ages where an age threshold is set).
    """
    return (await view(gw, consumers, with_age))[0]


async def view(gw: Any, consumers: list[str] | None = None, with_age: AgeWanted = True,
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`collect`'s entries, and how old their figures are (:func:`staleness`)."""
    registered, seen = await gw.registry.consumer_names()
    names = sorted(set(consumers) if consumers is not None else registered | seen)
    if not names:
        return [], staleness({}, now_ms(), gw.settings.metadata_refresh_ms)
    # Two pipelined round trips: configs, cluster-mode queues and clientIds; then the clientIds'
    # queue hashes.
    read = await gw.store.read_consumers(names)

    # One watermark read per topic, a few at a time.
    topics = sorted({q.topic for c in read for states in [c.queues, *c.client_queues.values()]
                     for q in states})
    wm = Watermarks(gw.store, gw.broker, gw.settings.metadata_refresh_ms)
    sem = asyncio.Semaphore(PEEK_CONCURRENCY)
    stamped = dict(zip(topics, await asyncio.gather(*(_shared(wm, t, sem) for t in topics)),
                       strict=True))
    his = {t: {q: hi for q, (_lo, hi) in s.queues.items()} for t, s in stamped.items()}

    now = now_ms()
    peeks = _Peeks(gw.broker)
    out = []
    for c in read:
        g, cfg = c.consumer, c.config
        age = with_age(cfg) if callable(with_age) else with_age
        prefix = gw.settings.retry_topic_prefix
        rows = [_row(q, None, his, now, peeks if age else None, prefix) for q in c.queues]
        client_rows = [(cid, ts, [_row(q, cid, his, now, peeks if age else None, prefix)
                                  for q in c.client_queues[cid]]) for cid, ts in c.clients]
        out.append((g, cfg, age, rows, client_rows))
    await peeks.run()  # fills every row's oldestAgeMs

    result = []
    for g, cfg, age, rows, client_rows in out:
        client_views = [{"clientId": c, "lastSeenMs": ts, "totalBacklog": sum(r["backlog"] for r in rs),
                         "oldestAgeMs": _oldest(rs, age)} for c, ts, rs in client_rows]
        all_rows = rows + [r for _, _, rs in client_rows for r in rs]
        cluster_total = sum(r["backlog"] for r in rows)
        result.append({
            "consumer": g,
            "registered": g in registered,
            "mode": cfg.get("mode") or ("broadcast" if client_views and not rows else "cluster"),
            "paused": cfg.get("paused") == "1",
            "alerts": thresholds(cfg) or None,
            # Cluster mode: everything not yet committed. Broadcast: every clientId must see every
            # record, so the consumer is as far behind as its slowest clientId.
            "totalBacklog": max([cluster_total, *(c["totalBacklog"] for c in client_views)]),
            "oldestAgeMs": _oldest(all_rows, age),
            "queues": all_rows,
            "clients": client_views,
        })
    return result, staleness(stamped, now, gw.settings.metadata_refresh_ms)


def thresholds(cfg: dict[str, str]) -> dict[str, int]:
    """The alert thresholds in a consumer's config hash (API names; unset ones left out)."""
    out = {}
    for api, field in (("backlogMessages", "alert_backlog"), ("oldestAgeMs", "alert_age_ms")):
        if cfg.get(field, "").isdigit() and int(cfg[field]) > 0:
            out[api] = int(cfg[field])
    return out


def _row(q: QueueState, client_id: str | None, his: dict[str, dict[str, int]], now: int,
         peeks: _Peeks | None, retry_prefix: str) -> dict[str, Any]:
    r = queue_row(q, his.get(q.topic, {}).get(q.queue, 0), now)
    row: dict[str, Any] = {
        "clientId": client_id, "topic": r.topic, "queue": r.queue,
        "maxOffset": r.max_offset, "committedOffset": r.committed, "backlog": r.backlog,
        "lockAgeMs": r.lock_age_ms, "lastAccessMs": r.last_access_ms,
        "oldestAgeMs": None,
        # the consumer's retry topic (nacked records waiting for their next attempt), not one
        # of the topics it reads: the console lists it apart
        "retry": r.topic.startswith(retry_prefix),
    }
    if peeks is not None and r.backlog > 0:
        peeks.add(row)
    return row


def _oldest(rows: list[dict[str, Any]], age_wanted: bool) -> int | None:
    """The largest known age; 0 when ages were asked for and nothing is waiting."""
    if not age_wanted:
        return None
    if not any(r["backlog"] for r in rows):
        return 0
    ages = [r["oldestAgeMs"] for r in rows if r["oldestAgeMs"] is not None]
    return max(ages) if ages else None


class _Peeks:
    """Broker reads of the record at each row's committed offset; one read per distinct
    (topic, queue, offset), at most :data:`PEEK_CONCURRENCY` at a time."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.rows: dict[tuple[str, str, int], list[dict[str, Any]]] = {}

    def add(self, row: dict[str, Any]) -> None:
        self.rows.setdefault((row["topic"], row["queue"], row["committedOffset"]), []).append(row)

    async def run(self) -> None:
        if not self.rows:
            return
        sem = asyncio.Semaphore(PEEK_CONCURRENCY)

        async def one(key: tuple[str, str, int]) -> None:
            async with sem:
                ts = await self._timestamp(*key)
            if ts is not None:
                age = max(0, now_ms() - ts)
                for row in self.rows[key]:
                    row["oldestAgeMs"] = age

        try:  # with the broker down every peek would take its timeout: bound them all together
            await asyncio.wait_for(asyncio.gather(*(one(k) for k in self.rows)), PEEK_BUDGET_S)
        except TimeoutError:
            log.warning("backlog ages: broker peeks took over %.0f s; the rest are unknown",
                        PEEK_BUDGET_S)

    async def _timestamp(self, topic: str, queue: str, offset: int) -> int | None:
        """Timestamp of the first readable record at or after ``offset`` (None: unknown)."""
        r = await head_record(self.broker, topic, queue, offset)
        return r.timestamp if r is not None and r.timestamp >= 0 else None


async def head_record(broker: Any, topic: str, queue: str, offset: int) -> Record | None:
    """The first readable record at or after ``offset`` (None: none, or the broker did not
    answer within :data:`PEEK_TIMEOUT_S`). The broker steps over what retention deleted, as it
    does for a fetch."""
    try:
        r = await asyncio.wait_for(broker.fetch(topic, queue, offset, 1), PEEK_TIMEOUT_S)
        return r.records[0] if r.records else None
    except Exception as e:  # noqa: BLE001 - a peek is a nicety: never fail the view for it
        log.warning("peek at %s/%s@%d unavailable: %r", topic, queue, offset, e)
    return None


async def _shared(wm: Watermarks, topic: str, sem: asyncio.Semaphore) -> Stamped:
    """The shared watermarks, refreshed from the broker when stale and this process wins the
    refresh lease (as the consume path does)."""
    async with sem:
        return await wm.shared(topic)


def staleness(stamped: dict[str, Stamped], now: int, refresh_ms: int) -> dict[str, Any]:
    """How old a view's figures are: ``watermarksAgeMs`` (the oldest topic's copy, since a
    node last read it from the broker; null with no topic), ``stale`` (older than a few refresh
    intervals: the broker has not been answering) and ``staleReason`` (its last error)."""
    written = [s.written_ms for s in stamped.values() if s.written_ms]
    problems = sorted({s.problem for s in stamped.values() if s.problem})
    age = max(0, now - min(written)) if written else None
    stale = age is not None and (age > max(5 * refresh_ms, STALE_AFTER_MS)
                                 or (bool(problems) and age > 2 * refresh_ms))
    reason = (problems[0] if problems else "the broker has not answered") if stale else None
    return {"watermarksAgeMs": age, "stale": stale, "staleReason": reason}
