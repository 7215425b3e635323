"""Registry records in Redis: consumers' config hashes and name sets, producers, API keys and
their per-consumer grants. Validation and the API's view of them are core/registry.py's and
core/auth.py's; this module only reads and writes (key names: keys.py).

Records are JSON objects (``dict[str, Any]``): produce_check.lua reads the producer and key
records too (``topics``; ``sha256``, ``producers``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson
from redis.asyncio import Redis

from .changes import RegistryChanges
from .connect import fields, text, text_dict
from .keys import KeyLayout
from .shards import parse_shards, shard_name, shard_of


class RegistryStore:
    def __init__(self, redis: Redis, layout: KeyLayout) -> None:
        self._redis = redis
        self._keys = layout
        #: Notices of key and producer writes to every process (they cache produce verdicts).
        self.changes = RegistryChanges(redis, layout)
        #: Told of every write, with the entity written (``consumer``, ``producer`` or ``key``,
        #: and its name), once Redis has it: the registry's durable copy
        #: (core/registry_copy.py) sends the entity to the broker.
        self.journal: Callable[[str, str], Awaitable[None]] | None = None

    async def wrote(self, kind: str, name: str) -> None:
        if self.journal is not None:
            await self.journal(kind, name)

    # -- consumers ---------------------------------------------------------------------------
    async def config(self, consumer: str) -> dict[str, str]:
        """The consumer's config hash (``{}`` if it has none)."""
        return text_dict(await self._redis.hgetall(self._keys.config(consumer)))

    async def replace_config(self, consumer: str, values: dict[str, str]) -> None:
        """Replace the whole config hash at once (MULTI: no reader sees it half written)."""
        key = self._keys.config(consumer)
        had = parse_shards(await self._redis.hget(key, "shards"))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=fields(values))
            await pipe.execute()
        await self.mirror(consumer, had)
        await self.wrote("consumer", consumer)

    async def update_config(self, consumer: str, sets: dict[str, str], deletes: list[str]) -> None:
        """Set and delete config fields at once (MULTI)."""
        key = self._keys.config(consumer)
        had = parse_shards(await self._redis.hget(key, "shards"))
        async with self._redis.pipeline(transaction=True) as pipe:
            if deletes:
                pipe.hdel(key, *deletes)
            if sets:
                pipe.hset(key, mapping=fields(sets))
            await pipe.execute()
        await self.mirror(consumer, had)
        await self.wrote("consumer", consumer)

    async def mirror(self, consumer: str, had: int = 1) -> None:
        """Copy the consumer's settings and grants into each of its other shards
        (store/shards.py), whose scripts read them in their own slot; each copy's rate limit is
        the consumer's divided by the shards (each shard has its own bucket). ``had``: the shard
        count before this write; copies beyond the new count are deleted. Nothing to do for a
        consumer of one shard (after one read)."""
        k, r = self._keys, self._redis
        async with r.pipeline(transaction=False) as pipe:
            pipe.hgetall(k.config(consumer))
            pipe.hgetall(k.grants(consumer))
            raw_cfg, raw_grants = await pipe.execute()
        cfg, grants = text_dict(raw_cfg), text_dict(raw_grants)
        n = parse_shards(cfg.get("shards"))
        copy = dict(cfg)
        for f in ("rate", "burst"):
            if cfg.get(f):
                copy[f] = f"{float(cfg[f]) / n:.6g}"
        if had != n:  # the copies of the count before: other names (shards.shard_name)
            for i in range(1, had):
                old = shard_name(consumer, i, had)
                await r.delete(k.config(old), k.grants(old), k.bucket(old))
        for i in range(1, n):
            name = shard_name(consumer, i, n)
            async with r.pipeline(transaction=True) as pipe:  # one slot: {G#i}
                pipe.delete(k.config(name), k.grants(name))
                if copy:
                    pipe.hset(k.config(name), mapping=fields(copy))
                if grants:
                    pipe.hset(k.grants(name), mapping=fields(grants))
                await pipe.execute()

    async def add_registered(self, consumer: str) -> None:
        await self._redis.sadd(self._keys.registry("consumers"), consumer)
        await self.wrote("consumer", consumer)

    async def mark_seen(self, consumer: str, now_ms: int) -> None:
        """List a consumer that fetched, or got settings without a registration, for the
        all-consumer views and alert thresholds, with the time it was last seen."""
        await self._redis.zadd(self._keys.registry("seen_at"), {consumer: now_ms})

    async def known(self, consumer: str, client_id: str = "") -> bool:
        """Whether the consumer (or its broadcast ``client_id``) left any trace: settings,
        offsets, clientIds, or an entry among the names seen. One round trip per slot (and one
        more for a clientId: its consumer's shard count)."""
        k = self._keys
        if client_id:  # in the clientId's shard (store/shards.py)
            shards = parse_shards(await self._redis.hget(k.config(consumer), "shards"))
            name = shard_name(consumer, shard_of(client_id, shards), shards)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.exists(k.queues(name, client_id))
                pipe.zscore(k.clients(name), client_id)
                n, score = await pipe.execute()
            return bool(n) or score is not None
        # the consumer's keys share its slot; the seen-names zset is the registry's
        n = await self._redis.exists(k.config(consumer), k.queues(consumer), k.clients(consumer))
        return bool(n) or await self._redis.zscore(k.registry("seen_at"), consumer) is not None

    async def consumer_names(self, seen_since_ms: int, seen_limit: int) -> tuple[set[str], dict[str, int]]:
        """(registered names, {seen name: last seen ms}): the seen ones since ``seen_since_ms``,
        at most the ``seen_limit`` most recent. Older entries are dropped on the way: in open
        mode any client can add names, and an ever-growing list would grow every view, alert
        evaluation and metrics scrape with it (1,151 names after one fuzzing run)."""
        seen_key = self._keys.registry("seen_at")
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.smembers(self._keys.registry("consumers"))
            pipe.zremrangebyscore(seen_key, "-inf", f"({seen_since_ms}")
            pipe.zrevrange(seen_key, 0, seen_limit - 1, withscores=True)
            reg, _, seen = await pipe.execute()
        return {text(x) for x in reg}, {text(n): int(s) for n, s in seen}

    async def delete_consumer(self, consumer: str, delete_offsets: bool) -> tuple[bool, int]:
        """Drop the settings and rate bucket and the name from both sets; with ``delete_offsets``
        every queue hash (cluster and each clientId's) and the clientId set too. Returns (it had
        settings, number of offset keys deleted)."""
        k, r = self._keys, self._redis
        existed = bool(await r.exists(k.config(consumer)))
        shards = parse_shards(await r.hget(k.config(consumer), "shards"))
        names = [shard_name(consumer, i, shards) for i in range(shards)]
        for name in names:  # the settings' copies in other shards too (mirror)
            await r.delete(k.config(name), k.bucket(name))
        await r.srem(k.registry("consumers"), consumer)
        await r.zrem(k.registry("seen_at"), consumer)
        deleted = 0
        for name in names if delete_offsets else []:
            keys = {k.queues(name), k.clients(name)}
            clients = cast("list[bytes | str]", await r.zrange(k.clients(name), 0, -1))
            keys |= {k.queues(name, text(c)) for c in clients}
            # expired from the clientId set but not (yet) as keys
            async for key in r.scan_iter(match=k.client_queues_pattern(name), count=1000):
                keys.add(text(key))
            for key in keys:
                deleted += await r.delete(key)
        if len(names) > 1 and not delete_offsets:  # the offsets kept stay where they are
            await r.hset(k.config(consumer), "shards", str(len(names)))
            await self.mirror(consumer, len(names))
        await self.wrote("consumer", consumer)
        return existed, deleted

    # -- producers ---------------------------------------------------------------------------
    async def producer(self, name: str) -> dict[str, Any] | None:
        raw = await self._redis.hget(self._keys.registry("producers"), name)
        return orjson.loads(raw) if raw is not None else None

    async def put_producer(self, name: str, record: dict[str, Any]) -> None:
        await self._redis.hset(self._keys.registry("producers"), name, orjson.dumps(record))
        await self.changes.announce()
        await self.wrote("producer", name)

    async def producers(self) -> list[dict[str, Any]]:
        raw = await self._redis.hgetall(self._keys.registry("producers"))
        return [orjson.loads(v) for v in raw.values()]

    async def delete_producer(self, name: str) -> bool:
        deleted = bool(await self._redis.hdel(self._keys.registry("producers"), name))
        await self.changes.announce()
        await self.wrote("producer", name)
        return deleted

    # -- API keys ----------------------------------------------------------------------------
    async def key(self, key_id: str) -> dict[str, Any] | None:
        raw = await self._redis.hget(self._keys.registry("keys"), key_id)
        return orjson.loads(raw) if raw else None

    async def all_keys(self) -> list[dict[str, Any]]:
        raw = await self._redis.hgetall(self._keys.registry("keys"))
        return [orjson.loads(v) for v in raw.values()]

    async def put_key(self, key_id: str, record: dict[str, Any]) -> None:
        await self._redis.hset(self._keys.registry("keys"), key_id, orjson.dumps(record))
        await self.changes.announce()
        await self.wrote("key", key_id)

    async def delete_key(self, key_id: str) -> None:
        await self._redis.hdel(self._keys.registry("keys"), key_id)
        await self.changes.announce()
        await self.wrote("key", key_id)

    async def grant(self, key_id: str, sha256: str, consumers: list[str]) -> None:
        """Copy the key's digest into each consumer's grants hash (read by the consume scripts,
        in the consumer's own slot)."""
        for g in consumers:
            await self._redis.hset(self._keys.grants(g), key_id, sha256)
            await self.mirror(g)
            await self.wrote("consumer", g)

    async def revoke_grants(self, key_id: str, consumers: list[str]) -> None:
        for g in consumers:
            await self._redis.hdel(self._keys.grants(g), key_id)
            await self.mirror(g)
            await self.wrote("consumer", g)
