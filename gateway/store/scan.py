"""Reading every consumer's state with bounded commands only, for ``mqgw snapshot``.

``ops/snapshot.py`` explains the method and its costs; this module carries it out:

1. ``SCAN MATCH P:{*}:q*`` finds the queue hashes (cluster mode and each broadcast clientId's);
2. ``HSCAN`` reads each of them, and each topic's watermark hash: small hashes in one call, big
   ones in bounded steps continued in later pipelines;
3. per consumer, ``HGETALL`` of its config hash and one call of ``bucket_level.lua``, which
   reports the rate-limit bucket refilled to Redis' time as choose.lua would (the prelude's
   refill), writing nothing.

Commands go in non-transactional pipelines of ``chunk``. The script is loaded once per
:class:`Scanner` (``SCRIPT LOAD``, on every primary of a Redis Cluster) and then called by its
SHA inside the pipelines; a NOSCRIPT reply (a failover or restart emptied the cache) loads it
again and repeats just those calls.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from . import scripts
from .connect import connect, text, text_dict
from .keys import KeyLayout, queue_field
from .queues import QueueState, parse_queue_hash

_I64 = 1 << 63


def lua_number(v: str | None) -> float | None:
    """Lua's ``tonumber`` for the values the scripts read with it (None for a non-number, and
    for inf and nan, which no script writes)."""
    if v is None:
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


@dataclass
class ScanStats:
    queue_keys: int = 0
    consumers: int = 0
    topics: int = 0
    pipelines: int = 0
    commands: int = 0  # pipelined commands and script loads (the SCANs are not counted)
    errors: int = 0  # replies that were errors (e.g. a key that is not a hash)
    read_ms: int = 0


@dataclass(frozen=True, slots=True)
class QueueHash:
    """One queue hash: a consumer in cluster mode (``client_id`` "") or one broadcast clientId."""

    consumer: str
    client_id: str
    queues: list[QueueState]
    poll_ms: int | None  # the last accepted /message on this hash; None if never


@dataclass(frozen=True, slots=True)
class Sample:
    hashes: list[QueueHash]  # sorted by consumer, then clientId
    configs: dict[str, dict[str, str]]  # consumer -> config hash ({} if none)
    tokens: dict[str, float | None]  # consumer -> bucket tokens now; None: no rate limit
    #: topic -> queue -> (low, high) watermark, None where the hash has no (integer) value
    watermarks: dict[str, dict[str, tuple[int | None, int | None]]]
    stats: ScanStats = field(default_factory=ScanStats)


class Scanner:
    """A reader with a client of its own: timeouts so a hung server cannot wedge the sampler, and
    a client name (``mqgw-snapshot``) that shows in CLIENT LIST."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._bucket_sha: str | None = None

    @classmethod
    def connect(cls, url: str, client_name: str = "mqgw-snapshot") -> Scanner:
        return cls(connect(url, decode_responses=True, socket_timeout=30,
                           socket_connect_timeout=10, client_name=client_name))

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def sample(self, prefix: str, *, count: int = 1000, chunk: int = 100) -> Sample:
        """Read everything under ``prefix``: ``count`` is SCAN/HSCAN's COUNT, ``chunk`` the
        commands per pipeline."""
        t0 = time.perf_counter()
        stats = ScanStats()
        layout = KeyLayout(prefix)
        found: dict[str, tuple[str, str]] = {}  # key -> (consumer, clientId); SCAN may repeat keys
        async for key in self._redis.scan_iter(match=layout.queue_key_pattern(), count=count):
            parsed = layout.parse_queue_key(text(key))
            if parsed:
                found[text(key)] = parsed
        keys = sorted(found, key=lambda k: found[k])
        consumers = sorted({g for g, _ in found.values()})
        stats.queue_keys, stats.consumers = len(keys), len(consumers)

        raw = await self._read_hashes(keys, stats, count, chunk)
        hashes = [QueueHash(*found[k], _queue_states(h, stats), _poll(h))
                  for k, h in zip(keys, raw, strict=True)]
        configs, tokens = await self._consumers(layout, consumers, stats, chunk)
        topics = sorted({q.topic for h in hashes for q in h.queues})
        stats.topics = len(topics)
        wm_raw = await self._read_hashes([layout.watermarks(t) for t in topics], stats, count, chunk)
        stats.read_ms = round((time.perf_counter() - t0) * 1000)
        return Sample(hashes, configs, tokens,
                      {t: _watermarks(h) for t, h in zip(topics, wm_raw, strict=True)}, stats)

    # -- reads ------------------------------------------------------------------------------------
    async def _pipelined(self, calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]],
                         stats: ScanStats, chunk: int) -> list[Any]:
        """Run ``(method, args, kwargs)`` calls in non-transactional pipelines of ``chunk``;
        replies that are errors come back as exceptions."""
        out: list[Any] = []
        for i in range(0, len(calls), chunk):
            async with self._redis.pipeline(transaction=False) as pipe:
                for name, args, kwargs in calls[i:i + chunk]:
                    getattr(pipe, name)(*args, **kwargs)
                out.extend(await pipe.execute(raise_on_error=False))
            stats.pipelines += 1
            stats.commands += len(calls[i:i + chunk])
        return out

    async def _read_hashes(self, keys: list[str], stats: ScanStats, count: int,
                           chunk: int) -> list[dict[str, str]]:
        """Every field of each hash via HSCAN COUNT ``count``: small hashes in one call, big ones
        in bounded steps (continued in later pipelines). A key that is not a hash reads as {}."""
        result: list[dict[str, str]] = [{} for _ in keys]
        todo = [(i, 0) for i in range(len(keys))]
        while todo:
            replies = await self._pipelined(
                [("hscan", (keys[i], cur), {"count": count}) for i, cur in todo], stats, chunk)
            nxt = []
            for (i, _), r in zip(todo, replies, strict=True):
                if isinstance(r, Exception):
                    stats.errors += 1
                    continue
                cursor, data = r
                result[i].update(text_dict(data))
                if int(cursor):
                    nxt.append((i, int(cursor)))
            todo = nxt
        return result

    async def _consumers(self, layout: KeyLayout, consumers: list[str], stats: ScanStats,
                         chunk: int) -> tuple[dict[str, dict[str, str]], dict[str, float | None]]:
        """Each consumer's config hash, and its bucket's tokens refilled to Redis' time (None
        without a rate limit): HGETALL and bucket_level.lua, pipelined side by side."""
        sha = await self._bucket_script(stats)
        replies = await self._pipelined(
            [c for g in consumers for c in (
                ("hgetall", (layout.config(g),), {}),
                _evalsha(sha, layout.config(g), layout.bucket(g)))], stats, chunk)
        configs: dict[str, dict[str, str]] = {}
        levels: dict[str, Any] = {}
        for i, g in enumerate(consumers):
            cfg, level = replies[2 * i], replies[2 * i + 1]
            if isinstance(cfg, Exception):
                stats.errors += 1
                cfg = {}
            configs[g] = text_dict(cfg)
            levels[g] = level
        lost = [g for g in consumers if isinstance(levels[g], NoScriptError)]
        if lost:  # the script cache was emptied since the load: load again, redo those calls
            sha = await self._bucket_script(stats, reload=True)
            again = await self._pipelined(
                [_evalsha(sha, layout.config(g), layout.bucket(g)) for g in lost],
                stats, chunk)
            levels.update(zip(lost, again, strict=True))
        tokens: dict[str, float | None] = {}
        for g in consumers:
            level = levels[g]
            if isinstance(level, Exception):
                stats.errors += 1
                level = None
            tokens[g] = float(level) if level is not None else None
        return configs, tokens

    async def _bucket_script(self, stats: ScanStats, reload: bool = False) -> str:
        if self._bucket_sha is None or reload:
            self._bucket_sha = text(await self._redis.script_load(scripts.source("bucket_level")))
            stats.commands += 1
        return self._bucket_sha


def _evalsha(sha: str, *keys: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """A pipelined EVALSHA. Through execute_command: redis-py refuses ``pipe.evalsha`` on Redis
    Cluster (it cannot route it in general), but routes EVALSHA by its keys, all in one slot here."""
    return "execute_command", ("EVALSHA", sha, len(keys), *keys), {}


def _queue_states(fields: dict[str, str], stats: ScanStats) -> list[QueueState]:
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
    return [q for q in states if queue_field(q.topic, q.queue, "com") in fields
            and (q.committed == 0 or queue_field(q.topic, q.queue, "max") in fields)]


def _poll(fields: dict[str, str]) -> int | None:
    poll = lua_number(fields.get("poll"))
    return int(poll) if poll is not None and 0 < poll < _I64 else None


def _watermarks(fields: dict[str, str]) -> dict[str, tuple[int | None, int | None]]:
    """``queue -> (lo, hi)`` from a watermark hash's ``<queue>:lo`` and ``<queue>:hi`` fields."""
    def num(v: str | None) -> int | None:
        return int(v) if v is not None and v.lstrip("-").isdigit() else None

    queues = {name.rpartition(":")[0] for name in fields if name.endswith((":lo", ":hi"))}
    return {q: (num(fields.get(f"{q}:lo")), num(fields.get(f"{q}:hi"))) for q in queues}
