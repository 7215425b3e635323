"""Connecting to Redis, and which Redis errors mean "unavailable, retry shortly"."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
import redis.exceptions

#: Unreachable, failing over, loading, read-only replica, cluster down: all "try again".
UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError, redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)


def connect(url: str, **kw: Any) -> aioredis.Redis:
    """``redis://`` for one server, ``redis+cluster://`` for Redis Cluster."""
    if url.startswith("redis+cluster://"):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url("redis://" + url[len("redis+cluster://"):], **kw)  # type: ignore[return-value]
    kw.setdefault("max_connections", 256)
    kw.setdefault("health_check_interval", 30)
    return aioredis.Redis.from_url(url, **kw)
