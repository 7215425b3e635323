"""Connecting to Redis, which Redis errors mean "unavailable, retry shortly", and turning its
replies (bytes, unless a client decodes them) into ``str``."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.typing import EncodableT

#: Unreachable, failing over, loading, read-only replica, cluster down, full (``maxmemory`` with
#: ``noeviction``, the setting the deploy files use: Redis refuses writes instead of evicting
#: offsets): all "try again", a 503 rather than a 500, while an operator frees or adds memory.
UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError, redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError, redis.exceptions.OutOfMemoryError,
)


#: Connections per client unless the caller says (the gateway passes ``redis_max_connections``).
MAX_CONNECTIONS = 64
#: Seconds a command waits for a free pooled connection before failing as "unavailable".
POOL_TIMEOUT_S = 5.0


def connect(url: str, max_connections: int = MAX_CONNECTIONS, pool_timeout_s: float = POOL_TIMEOUT_S,
            **kw: Any) -> aioredis.Redis:
    """``redis://`` for one server, ``redis+cluster://`` for Redis Cluster. ``kw`` goes to the
    client (e.g. ``decode_responses``, timeouts, ``client_name``).

    One server: a *blocking* pool of ``max_connections``. A command that finds every connection
    busy waits up to ``pool_timeout_s`` for one; only then does it fail with ConnectionError (one
    of :data:`UNAVAILABLE`: a 503). redis-py's default pool fails at once instead ("Too many
    connections"): 1,000 long polls arriving together on one node got 369 503s from a healthy
    Redis with a non-blocking pool of 256. Connections are held only for a command's round trip
    (a waiting long poll holds none), so a few dozen serve thousands of requests; Redis answers
    one command at a time anyway.

    Redis Cluster: redis-py's cluster client keeps a pool per node with no blocking variant and
    no bound by default; it is left so (a bound there would fail at once, not wait).
    """
    if url.startswith("redis+cluster://"):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url("redis://" + url[len("redis+cluster://"):], **kw)  # type: ignore[return-value]
    kw.setdefault("health_check_interval", 30)
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections,
                                                    timeout=pool_timeout_s, **kw)
    return aioredis.Redis.from_pool(pool)


def text(v: bytes | str | int | float) -> str:
    """One reply value as ``str``."""
    return v.decode() if isinstance(v, bytes) else str(v)


def text_dict(raw: dict[Any, Any]) -> dict[str, str]:
    """A hash reply (HGETALL, HSCAN) as ``{str: str}``."""
    return {text(k): text(v) for k, v in raw.items()}


def fields(values: dict[str, str] | dict[str, str | int]) -> dict[EncodableT, EncodableT]:
    """A ``{str: str | int}`` mapping as HSET's ``mapping`` (typed: redis-py's is invariant)."""
    return {k: v for k, v in values.items()}
