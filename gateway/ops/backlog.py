"""Backlog of every consumer: per queue (and broadcast clientId) the records not yet committed,
and how old the oldest of them is.

Everything is read from Redis in a few pipelined round trips whatever the number of consumers
(configs, queue hashes and clientId sets; then the clientIds' hashes; then one watermark read
per topic). ``maxOffset`` is the larger of the consumer's stored max and the topic's shared
watermarks; when those are older than ``metadata_refresh_ms`` the usual lease lets one process
refresh them from the broker, so the backlog of a topic nobody reads any more keeps growing in
the view instead of freezing. The age needs one broker read per queue with a backlog: the
record at the committed offset, whose timestamp says how long it has been waiting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from operator import methodcaller
from typing import Any

from ..store import QueueState, now_ms, parse_queue_hash

log = logging.getLogger("mqgw.backlog")

#: Concurrent broker reads for ages, per call.
PEEK_CONCURRENCY = 8
PEEK_TIMEOUT_S = 5.0
#: All peeks of one view or alert evaluation together: well inside the alert lock's 30 s, so an
#: evaluation never outlives its lock (and gets dropped) because the broker is slow.
PEEK_BUDGET_S = 10.0
#: Commands per pipeline round trip.
_CHUNK = 500
_NODE_ID = f"{socket.gethostname()}:{os.getpid()}"

AgeWanted = bool | Callable[[dict[str, str]], bool]


async def collect(gw: Any, consumers: list[str] | None = None,
                  with_age: AgeWanted = True) -> list[dict[str, Any]]:
    """One entry per consumer (registered ∪ seen, or ``consumers``), sorted by name.

    ``with_age`` may also be a predicate on the consumer's config hash (the alert monitor only
    asks for ages where an age threshold is set).
    """
    store, redis = gw.store, gw.redis
    registered, seen = await gw.registry.consumer_names()
    names = sorted(set(consumers) if consumers is not None else registered | seen)
    if not names:
        return []

    # Round trip 1: config, cluster-mode queues and broadcast clientIds of every consumer.
    first = await _pipelined(redis, [c for g in names for c in (
        methodcaller("hgetall", store.config_key(g)), methodcaller("hgetall", store.queues_key(g)),
        methodcaller("zrange", store.clients_key(g), 0, -1, withscores=True))])
    cfgs = {g: _strs(first[3 * i]) for i, g in enumerate(names)}
    cluster = {g: parse_queue_hash(_strs(first[3 * i + 1])) for i, g in enumerate(names)}
    clients = {g: [(_s(m), int(s)) for m, s in first[3 * i + 2]] for i, g in enumerate(names)}

    # Round trip 2: every broadcast clientId's queue hash.
    pairs = [(g, c) for g in names for c, _ in clients[g]]
    hashes = await _pipelined(redis, [methodcaller("hgetall", store.queues_key(g, c)) for g, c in pairs])
    per_client = {pair: parse_queue_hash(_strs(h)) for pair, h in zip(pairs, hashes)}

    # One watermark read per topic, a few at a time.
    topics = sorted({q.topic for states in [*cluster.values(), *per_client.values()] for q in states})
    sem = asyncio.Semaphore(PEEK_CONCURRENCY)
    his = dict(zip(topics, await asyncio.gather(*(_high_watermarks(gw, t, sem) for t in topics))))

    now = now_ms()
    peeks = _Peeks(gw.broker)
    out = []
    for g in names:
        cfg = cfgs[g]
        age = with_age(cfg) if callable(with_age) else with_age
        rows = [_row(q, None, his, now, peeks if age else None) for q in cluster[g]]
        client_rows = [(c, ts, [_row(q, c, his, now, peeks if age else None)
                                for q in per_client[(g, c)]]) for c, ts in clients[g]]
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
    return result


def thresholds(cfg: dict[str, str]) -> dict[str, int]:
    """The alert thresholds in a consumer's config hash (API names; unset ones left out)."""
    out = {}
    for api, field in (("backlogMessages", "alert_backlog"), ("oldestAgeMs", "alert_age_ms")):
        if cfg.get(field, "").isdigit() and int(cfg[field]) > 0:
            out[api] = int(cfg[field])
    return out


def _row(q: QueueState, client_id: str | None, his: dict[str, dict[str, int]], now: int,
         peeks: _Peeks | None) -> dict[str, Any]:
    max_offset = max(q.max_offset, his.get(q.topic, {}).get(q.queue, 0))
    backlog = max(0, max_offset - q.committed)
    row: dict[str, Any] = {
        "clientId": client_id, "topic": q.topic, "queue": q.queue,
        "maxOffset": max_offset, "committedOffset": q.committed, "backlog": backlog,
        "lockAgeMs": now - q.lock_ms if q.lock_ms else None,
        "lastAccessMs": q.access_ms or None,
        "oldestAgeMs": None,
    }
    if peeks is not None and backlog > 0:
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
        try:
            for _ in range(2):
                r = await asyncio.wait_for(self.broker.fetch(topic, queue, offset, 1), PEEK_TIMEOUT_S)
                if r.records:
                    ts = r.records[0].timestamp
                    return ts if ts >= 0 else None
                if not (r.out_of_range and r.low_watermark > offset):
                    return None
                offset = r.low_watermark  # the committed offset fell out of retention
        except Exception as e:  # an age is a nicety: never fail the view for it
            log.warning("backlog age of %s/%s@%d unavailable: %r", topic, queue, offset, e)
        return None


async def _high_watermarks(gw: Any, topic: str, sem: asyncio.Semaphore) -> dict[str, int]:
    """``{queue: hi}`` from the shared watermarks, refreshed from the broker when stale and
    this process wins the refresh lease (as the consume path does)."""
    async with sem:
        lease, wm, _ts = await gw.store.read_watermarks(topic, gw.settings.metadata_refresh_ms, _NODE_ID)
        if lease or not wm:
            try:
                fresh = await gw.broker.watermarks(topic)
                await gw.store.write_watermarks(topic, fresh)  # only ever moves them forward
                for q, (lo, hi) in fresh.items():
                    wm[q] = (lo, max(hi, wm.get(q, (0, 0))[1]))
            except Exception as e:  # unknown or unreachable topic: the stored offsets still count
                log.info("watermarks of %s unavailable for the backlog view: %r", topic, e)
    return {q: hi for q, (_lo, hi) in wm.items()}


async def _pipelined(redis: Any, commands: list[methodcaller]) -> list[Any]:
    """Run commands in non-transactional pipelines (several slots are fine on Redis Cluster)."""
    out: list[Any] = []
    for i in range(0, len(commands), _CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for command in commands[i:i + _CHUNK]:
                command(pipe)
            out.extend(await pipe.execute())
    return out


def _strs(raw: dict[Any, Any]) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in raw.items()}


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
