"""The registry as entities, for its durable copy in the broker (core/registry_copy.py).

An *entity* is what one admin write changes, read whole from Redis so that the copy holds its
latest state under one key (a compacted topic keeps the last record per key):

- ``consumer/<name>``: ``{"cfg": <config hash>, "registered": bool, "grants": <grants hash>}``
  (registration, mode, start, retry policy, rate limits, alert thresholds, pause; the API keys
  that may consume as it);
- ``producer/<name>``: the producer's JSON record;
- ``key/<id>``: the API key's JSON record (the sha256 of the key, never the key).

An entity that no longer exists reads as ``None`` (a tombstone in the copy). :meth:`load` writes
entities back only where Redis has nothing of them, so a write made after the loss wins over the
copy. The ``P:{reg}:copied`` marker says that this Redis holds the registry (restored, or copied
from): a Redis that lost its data lacks it.
"""

from __future__ import annotations

from typing import Any, cast

import orjson
from redis.asyncio import Redis

from .connect import text, text_dict
from .keys import KeyLayout, RegistryKey
from .registry import RegistryStore

#: How long a node may take to restore the registry before another may try.
RESTORE_LOCK_MS = 60_000

Entity = dict[str, Any]


def entity_key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


class RegistryCopyStore:
    def __init__(self, redis: Redis, layout: KeyLayout, registry: RegistryStore) -> None:
        self._redis = redis
        self._keys = layout
        self._registry = registry
        self._changes = registry.changes

    # -- reading entities ------------------------------------------------------------------
    async def read(self, kind: str, name: str) -> Entity | None:
        """One entity as Redis holds it now (None: it does not exist)."""
        k, r = self._keys, self._redis
        if kind == "consumer":
            # not a transaction: the registry's set and the consumer's hashes are in different
            # slots of a Redis Cluster; the copy is re-read after every write anyway
            async with r.pipeline(transaction=False) as pipe:
                pipe.hgetall(k.config(name))
                pipe.sismember(k.registry("consumers"), name)
                pipe.hgetall(k.grants(name))
                cfg, registered, grants = await pipe.execute()
            if not cfg and not grants:
                return None
            return {"cfg": text_dict(cfg), "registered": bool(registered), "grants": text_dict(grants)}
        what: RegistryKey = "producers" if kind == "producer" else "keys"
        raw = await r.hget(k.registry(what), name)
        return cast("Entity", orjson.loads(raw)) if raw else None

    async def read_all(self) -> dict[str, Entity]:
        """Every entity: registered consumers, consumers with settings or grants, producers, keys."""
        k, r = self._keys, self._redis
        names = {text(n) for n in await r.smembers(k.registry("consumers"))}
        seen = cast("list[bytes | str]", await r.zrange(k.registry("seen_at"), 0, -1))
        names |= {text(n) for n in seen}
        for pattern in (k.config("*"), k.grants("*")):
            async for key in r.scan_iter(match=pattern, count=1000):
                name = text(key)[len(k.prefix) + 2:].split("}", 1)[0]
                if "#" not in name:  # a shard's copy (store/shards.py), not a consumer
                    names.add(name)
        out: dict[str, Entity] = {}
        for name in sorted(names):
            e = await self.read("consumer", name)
            if e is not None:
                out[entity_key("consumer", name)] = e
        tables: tuple[tuple[str, RegistryKey], ...] = (("producer", "producers"), ("key", "keys"))
        for kind, table in tables:
            for n, raw in (await r.hgetall(k.registry(table))).items():
                out[entity_key(kind, text(n))] = orjson.loads(raw)
        return out

    # -- restoring -------------------------------------------------------------------------
    async def load(self, entities: dict[str, Entity]) -> int:
        """Write back the entities Redis has nothing of; how many were written. Every process
        drops its cached produce verdicts after (as after any key or producer write)."""
        k, r = self._keys, self._redis
        written = 0
        for ek, e in entities.items():
            kind, name = ek.split("/", 1)
            if kind == "consumer":
                cfg, grants = e.get("cfg") or {}, e.get("grants") or {}
                async with r.pipeline(transaction=False) as pipe:
                    pipe.exists(k.config(name))
                    pipe.exists(k.grants(name))
                    has_cfg, has_grants = await pipe.execute()
                wrote = False
                async with r.pipeline(transaction=False) as pipe:  # two slots (see read)
                    if cfg and not has_cfg:
                        pipe.hset(k.config(name), mapping=cfg)
                        if e.get("registered"):
                            pipe.sadd(k.registry("consumers"), name)
                        wrote = True
                    if grants and not has_grants:
                        pipe.hset(k.grants(name), mapping=grants)
                        wrote = True
                    if wrote:
                        await pipe.execute()
                if wrote:  # and the copies of a consumer with shards
                    await self._registry.mirror(name)
                written += wrote
            elif kind in ("producer", "key"):
                what: RegistryKey = "producers" if kind == "producer" else "keys"
                written += int(await r.hsetnx(k.registry(what), name, orjson.dumps(e)))
        if written:
            await self._changes.announce()
        return written

    # -- copies the broker did not take yet ---------------------------------------------------
    async def mark_pending(self, entity: str) -> None:
        await self._redis.sadd(self._keys.registry("copy_pending"), entity)

    async def pending(self, limit: int = 500) -> list[str]:
        got = cast("list[bytes | str]", await self._redis.srandmember(
            self._keys.registry("copy_pending"), limit))
        return [text(e) for e in got]

    async def clear_pending(self, entities: list[str]) -> None:
        """Drop entities whose copy was sent. A write of one of them whose own copy fails
        between the read that was sent and this SREM loses its mark here (its state is then
        copied at the entity's next write): a window of one round trip, while the broker both
        takes and refuses copies."""
        if entities:
            await self._redis.srem(self._keys.registry("copy_pending"), *entities)

    async def has_copy_marker(self) -> bool:
        return bool(await self._redis.exists(self._keys.registry("copied")))

    async def set_copy_marker(self, node: str) -> None:
        await self._redis.set(self._keys.registry("copied"), node)

    async def drop_copy_marker(self) -> None:
        """After a write made outside the gateway: its processes reconcile the copy with Redis."""
        await self._redis.delete(self._keys.registry("copied"))

    async def take_restore_lock(self, node: str) -> bool:
        return bool(await self._redis.set(self._keys.registry("copy_lock"), node, nx=True,
                                          px=RESTORE_LOCK_MS))

    async def drop_restore_lock(self, node: str) -> None:
        key = self._keys.registry("copy_lock")
        if text(await self._redis.get(key) or b"") == node:
            await self._redis.delete(key)
