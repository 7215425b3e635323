"""After Redis restarts, the first requests succeed: no 503s from the pool's dead connections
(issue 20).

Every connection in the pool outlives a Redis restart as a dead socket, and the pool's check
before handing one out does not notice (the peer's close is only seen when a reply is read).
redis-py's client retries such a command by default, but not on a pool made by the caller, as
store/connect.py makes it: each request that drew a dead connection answered 503 ("Connection
closed by server"), 8 of 8 concurrent ones right after a restart. Now a command is sent once
more on a new connection (``connect.reconnect_once``).

Each test restarts a redis-server of its own on the same port.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.cli import devstack

from ..support import TLS, start_node, unique

CONCURRENT = 8

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="needs redis-server to restart one of its own")


@pytest.fixture
def private_redis() -> Iterator[list[devstack.Service]]:
    """A list holding the running server (a restart replaces it), stopped at the end."""
    svc = [devstack.start_redis()]
    try:
        yield svc
    finally:
        svc[0].stop()


def _restart(svc: list[devstack.Service]) -> None:
    port = svc[0].port
    svc[0].stop()
    svc[0] = devstack.start_redis(port)  # returns once it accepts connections


def test_pooled_connections_survive_a_restart(private_redis: list[devstack.Service]) -> None:
    from gateway.store import UNAVAILABLE, connect

    async def main() -> None:
        client = connect(private_redis[0].extra["url"])
        try:
            # several connections in the pool, each idle when Redis goes away
            await asyncio.gather(*(client.ping() for _ in range(CONCURRENT)))
            _restart(private_redis)
            got = await asyncio.gather(*(client.incr("n") for _ in range(CONCURRENT)),
                                       return_exceptions=True)
            assert [g for g in got if isinstance(g, BaseException)] == []
            assert sorted(got) == list(range(1, CONCURRENT + 1))  # each ran once

            # Redis down: the retry reconnects once, fails, and the error comes at once
            private_redis[0].stop()
            with pytest.raises(UNAVAILABLE):
                await client.incr("n")
        finally:
            await client.aclose()
    asyncio.run(main())


def test_requests_after_a_restart_succeed(private_redis: list[devstack.Service], bootstrap: str,
                                          tmp_path: Path) -> None:
    topic = unique("rr")
    devstack.create_topic(bootstrap, topic, 2)
    node = start_node(private_redis[0].extra["url"], bootstrap, tmp_path)
    group = unique("g")

    async def burst(http: httpx.AsyncClient) -> list[int]:
        rs = await asyncio.gather(*(http.get(f"{node.url}/message", params={
            "consumer": group, "topic": topic, "wait_ms": 0}) for _ in range(CONCURRENT)))
        return [r.status_code for r in rs]

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30, verify=TLS) as http:
            assert await burst(http) == [200] * CONCURRENT  # fills the pool
            _restart(private_redis)
            # Redis' state is gone (no persistence); open mode serves the consumer afresh
            assert await burst(http) == [200] * CONCURRENT
    try:
        asyncio.run(main())
    finally:
        node.stop()
