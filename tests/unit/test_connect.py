"""The ``redis_url`` forms (store/connect.py): one server, Redis Cluster with several seeds,
Sentinel; what is wrong with a URL is said before any connection is tried."""

from __future__ import annotations

import pytest
import redis.exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from gateway.config import redact_url
from gateway.store.connect import UNAVAILABLE, connect, parse_url


def test_one_server() -> None:
    a = parse_url("redis://:secret@db.example:6380/3")
    assert (a.scheme, a.hosts, a.password, a.db, a.tls) == ("redis", [("db.example", 6380)],
                                                             "secret", 3, False)
    assert parse_url("rediss://h").tls and parse_url("rediss://h").hosts == [("h", 6379)]
    assert parse_url("unix:///run/redis.sock?db=2").scheme == "unix"


def test_several_cluster_seeds_and_ipv6() -> None:
    a = parse_url("redis+cluster://u:p%40ss@h1:7000,[::1]:7001,h3")
    assert a.scheme == "redis+cluster" and (a.username, a.password) == ("u", "p@ss")
    assert a.hosts == [("h1", 7000), ("::1", 7001), ("h3", 6379)]
    client = connect("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    assert isinstance(client, RedisCluster)
    assert [(n.host, n.port) for n in client.nodes_manager.startup_nodes.values()] == [
        ("127.0.0.1", 7000), ("127.0.0.1", 7001)]


def test_sentinel() -> None:
    a = parse_url("redis+sentinel://:pw@s1,s2:26380/orders-redis/2?sentinel_password=spw")
    assert a.scheme == "redis+sentinel" and a.service == "orders-redis" and a.db == 2
    assert a.hosts == [("s1", 26379), ("s2", 26380)] and a.password == "pw"
    assert a.options == {"sentinel_password": "spw"}
    client = connect("redis+sentinel://127.0.0.1:26379/orders-redis/2?sentinel_password=spw")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "orders-redis"
    assert pool.connection_kwargs["db"] == 2
    assert client.get_retry() is not None  # one reconnect: lands on a promoted primary


@pytest.mark.parametrize(("url", "says"), [
    ("http://h:1", "must start with"),
    ("redis+cluster://h1:p1,h2:p2", "not a host[:port]"),  # was "Port could not be cast"
    ("redis://a:1,b:2", "names one server"),
    ("redis+sentinel://s1:26379", "primary's name"),
    ("redis+cluster://h/1", "only database 0"),
    ("redis+sentinel://s/m/x", "must be a number"),
    ("redis+cluster://h?socket_timeout=1", "takes no option"),
    ("redis+cluster://h:99999", "not a host[:port]"),
])
def test_what_is_wrong_is_said(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_url(url)


def test_an_unreachable_cluster_is_unavailable_not_an_error() -> None:
    """No seed answering (or a slot without a primary during a failover) is a 503, like a
    connection error; before, a node failed to start (RedisClusterUnreachableError)."""
    assert issubclass(redis.exceptions.RedisClusterUnreachableError, UNAVAILABLE)
    assert issubclass(redis.exceptions.SlotNotCoveredError, UNAVAILABLE)


def test_passwords_are_redacted() -> None:
    assert redact_url("redis+sentinel://u:pw@s1,s2/m?sentinel_password=spw&x=1") == \
        "redis+sentinel://***@s1,s2/m?sentinel_password=***&x=1"
