"""Connecting to Redis, which Redis errors mean "unavailable, retry shortly", and turning its
replies (bytes, unless a client decodes them) into ``str``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

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
    # Redis Cluster with no seed answering, or a slot whose primary is failing over: not
    # ConnectionErrors, and a 500 (or a node that failed to start) before they were listed here.
    redis.exceptions.RedisClusterUnreachableError, redis.exceptions.SlotNotCoveredError,
)

#: The URL schemes :func:`connect` takes (``rediss``: TLS), and each one's default port.
SCHEMES = {"redis": 6379, "rediss": 6379, "redis+cluster": 6379, "rediss+cluster": 6379,
           "redis+sentinel": 26379, "rediss+sentinel": 26379}


#: Connections per client unless the caller says (the gateway passes ``redis_max_connections``).
MAX_CONNECTIONS = 64
#: Seconds a command waits for a free pooled connection before failing as "unavailable".
POOL_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class RedisAddress:
    """A ``redis_url`` taken apart (:func:`parse_url`): what a client needs besides its pool."""

    scheme: str  # redis | redis+cluster | redis+sentinel (TLS: ``tls``) | unix
    hosts: list[tuple[str, int]]
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: bool = False
    service: str = ""  # Sentinel: the name of the monitored primary
    options: dict[str, str] = field(default_factory=dict)  # the query string


def parse_url(url: str) -> RedisAddress:
    """Check and take apart a ``redis_url``; ValueError says what is wrong with it.

    ``redis://[[user]:password@]host[:port][/db]`` one server (``rediss://`` with TLS, and any
    option redis-py takes in the query string; ``unix:///path?db=N`` a socket);
    ``redis+cluster://[[user]:password@]host[:port][,host[:port]...]`` Redis Cluster: any seed
    that answers serves (a node started while the first seed was down failed to start before);
    ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/<primary name>[/db]
    [?sentinel_password=...&sentinel_username=...]`` Redis Sentinel: the sentinels (port 26379 by
    default) name the primary, and a failover is followed without a restart. The user and
    password are the data servers'; the sentinels' own come in the query string.
    """
    scheme, sep, rest = url.partition("://")
    if scheme == "unix" and sep:  # a socket path: redis-py's from_url takes it as it is
        return RedisAddress("unix", [])
    if not sep or scheme not in SCHEMES:
        raise ValueError("redis_url must start with one of "
                         f"{', '.join(s + '://' for s in (*SCHEMES, 'unix'))}")
    tls = scheme.startswith("rediss")
    kind = scheme.replace("rediss", "redis")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(pw) if colon else None
    hosts = [_host_port(h, SCHEMES[scheme]) for h in hostlist.split(",")]
    if kind == "redis" and len(hosts) > 1:
        raise ValueError("redis:// names one server; several seeds are redis+cluster://, several "
                         "sentinels redis+sentinel://")
    parts = [p for p in path.split("/") if p]
    service = ""
    if kind == "redis+sentinel":
        if not parts:
            raise ValueError("redis+sentinel:// needs the primary's name as the path: "
                             "redis+sentinel://host1:26379,host2:26379/mymaster[/db]")
        service = unquote(parts.pop(0))
    if len(parts) > 1 or (parts and not parts[0].isdigit()):
        raise ValueError(f"the database must be a number: {'/'.join(parts)!r}")
    db = int(parts[0]) if parts else 0
    if kind == "redis+cluster" and db:
        raise ValueError("Redis Cluster has only database 0")
    options = dict(parse_qsl(query, keep_blank_values=True))
    if kind != "redis":
        unknown = set(options) - ({"sentinel_username", "sentinel_password"}
                                  if kind == "redis+sentinel" else set())
        if unknown:
            raise ValueError(f"{scheme}:// takes no option {', '.join(sorted(unknown))}")
    return RedisAddress(kind, hosts, username, password, db, tls, service, options)


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    if text.startswith("["):
        host, _, tail = text[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else "" if not tail else None
    else:
        host, colon, port_text = text.partition(":")
        port = port_text if colon else ""
    if not host or port is None or (port and not port.isdigit()) or \
            not 0 < int(port or default_port) < 65536:
        raise ValueError(f"not a host[:port]: {text!r}")
    return host, int(port or default_port)


def connect(url: str, max_connections: int = MAX_CONNECTIONS, pool_timeout_s: float = POOL_TIMEOUT_S,
            **kw: Any) -> aioredis.Redis:
    """A client for ``url`` (:func:`parse_url` lists the forms). ``kw`` goes to the client (e.g.
    ``decode_responses``, timeouts, ``client_name``).

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
    own retries. Sentinel: redis-py's Sentinel pool asks the sentinels for the primary at each
    new connection, and a connection to a primary that was demoted fails (ReadOnlyError becomes
    ConnectionError there), so the one retry lands on the new primary once it is promoted; its
    pool has no blocking variant either and is left unbounded.
    """
    a = parse_url(url)
    if a.scheme == "redis+cluster":
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in a.hosts],  # type: ignore[return-value]
                            username=a.username, password=a.password, ssl=a.tls, **kw)
    kw.setdefault("health_check_interval", 30)
    kw.setdefault("retry", reconnect_once())
    if a.scheme == "redis+sentinel":
        from redis.asyncio.sentinel import Sentinel

        sentinel_kw: dict[str, Any] = {k[len("sentinel_"):]: v for k, v in a.options.items()}
        for k in ("socket_timeout", "socket_connect_timeout"):  # a sentinel that hangs is skipped
            if k in kw:
                sentinel_kw.setdefault(k, kw[k])
        sentinel_kw.setdefault("socket_connect_timeout", 2.0)
        sentinel_kw.setdefault("socket_timeout", 2.0)
        if a.tls:
            sentinel_kw["ssl"] = True
        sentinels = Sentinel(a.hosts, sentinel_kwargs=sentinel_kw, username=a.username,
                             password=a.password, db=a.db, ssl=a.tls)
        client: aioredis.Redis = sentinels.master_for(a.service, **kw)
        return client
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
