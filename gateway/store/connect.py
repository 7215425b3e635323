"""Connecting to Redis, which Redis errors mean "unavailable, retry shortly", and turning its
replies (bytes, unless a client decodes them) into ``str``."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.typing import EncodableT

#: Unreachable, failing over, loading, read-only replica, cluster down: all "try again".
UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError, redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
)


def connect(url: str, **kw: Any) -> aioredis.Redis:
    """``redis://`` for one server, ``redis+cluster://`` for Redis Cluster. ``kw`` goes to the
    client (e.g. ``decode_responses``, timeouts, ``client_name``)."""
    if url.startswith("redis+cluster://"):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url("redis://" + url[len("redis+cluster://"):], **kw)  # type: ignore[return-value]
    kw.setdefault("max_connections", 256)
    kw.setdefault("health_check_interval", 30)
    return aioredis.Redis.from_url(url, **kw)


def text(v: bytes | str | int | float) -> str:
    """One reply value as ``str``."""
    return v.decode() if isinstance(v, bytes) else str(v)


def text_dict(raw: dict[Any, Any]) -> dict[str, str]:
    """A hash reply (HGETALL, HSCAN) as ``{str: str}``."""
    return {text(k): text(v) for k, v in raw.items()}


def fields(values: dict[str, str] | dict[str, str | int]) -> dict[EncodableT, EncodableT]:
    """A ``{str: str | int}`` mapping as HSET's ``mapping`` (typed: redis-py's is invariant)."""
    return {k: v for k, v in values.items()}
