"""Connecting to Redis, which Redis errors mean "unavailable, retry shortly", and turning its
replies (bytes, unless a client decodes them) into ``str``."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
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

    A command whose pooled connection turns out dead is sent once more on a new connection
    (:func:`reconnect_once`): after Redis restarts, every connection in the pool is. Without it,
    each request that drew one answered 503 (8 of 8 concurrent commands right after a restart;
    tests/system/test_redis_restart.py). A pool made here gets no retry policy from redis-py's client
    (its default of 10 retries applies only to a pool the client makes itself).

    Redis Cluster: redis-py's cluster client keeps a pool per node with no blocking variant and
    no bound by default; it is left so (a bound there would fail at once, not wait), as are its
    own retries.
    """
    if url.startswith("redis+cluster://"):
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url("redis://" + url[len("redis+cluster://"):], **kw)  # type: ignore[return-value]
    kw.setdefault("health_check_interval", 30)
    kw.setdefault("retry", reconnect_once())
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections,
                                                    timeout=pool_timeout_s, **kw)
    return aioredis.Redis.from_pool(pool)


def reconnect_once() -> Retry:
    """On a ConnectionError, reconnect and send the command once more, at once.

    Once only, and on nothing else (not on a timeout): while Redis is down the second try fails
    at connect and the request answers 503 without waiting, and a command that Redis may have run
    (a reply lost to a timeout) is not run again. A connection that dies between a command and its
    reply can still run it twice, as any client retry can; the scripts bear that (a repeated ack
    answers ``already_committed``; the lock of a choose whose reply was lost expires like a
    crashed client's)."""
    return Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


def database(client: aioredis.Redis) -> int:
    """The database number ``client`` works in (0 on Redis Cluster, which has only that one)."""
    pool = getattr(client, "connection_pool", None)
    return int(pool.connection_kwargs.get("db") or 0) if pool is not None else 0


def text(v: bytes | str | int | float) -> str:
    """One reply value as ``str``."""
    return v.decode() if isinstance(v, bytes) else str(v)


def text_dict(raw: dict[Any, Any]) -> dict[str, str]:
    """A hash reply (HGETALL, HSCAN) as ``{str: str}``."""
    return {text(k): text(v) for k, v in raw.items()}


def fields(values: dict[str, str] | dict[str, str | int]) -> dict[EncodableT, EncodableT]:
    """A ``{str: str | int}`` mapping as HSET's ``mapping`` (typed: redis-py's is invariant)."""
    return {k: v for k, v in values.items()}
