"""Pub/sub notices stay inside their deployment: same Redis server and key prefix, other database
(issue 20).

Redis pub/sub ignores database numbers. With channel names made of the prefix alone, a node in
database 1 heard the registry notices of a node in database 0: every key or producer write
counted it among the processes to wait for (PUBLISH reached it) but its acknowledgement went to
the other database, so each write waited the full 2 s, and the other deployment's
acknowledgements could end a wait early. The delay relays' wake-ups crossed over the same way.
Asserted on subscriber counts and on what the write itself reports, not on timing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis

from ..support import start_node, unique


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def _two_databases(redis_url: str) -> tuple[str, str]:
    """The suite's database and a neighbour on the same server."""
    base = int(redis.Redis.from_url(redis_url).connection_pool.connection_kwargs.get("db") or 0)
    other = base + 1 if base < 15 else base - 1
    return _with_db(redis_url, base), _with_db(redis_url, other)


def _numsub(r: redis.Redis, channel: str) -> int:
    return int(dict(r.pubsub_numsub(channel))[channel.encode()])


def _wait_subscribed(r: redis.Redis, channels: dict[str, int], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while {c: _numsub(r, c) for c in channels} != channels:
        assert time.monotonic() < deadline, {c: _numsub(r, c) for c in channels}
        time.sleep(0.05)


def test_registry_notices_stay_in_their_database(redis_url: str, bootstrap: str,
                                                tmp_path: Path) -> None:
    from gateway.store import OffsetStore

    url_a, url_b = _two_databases(redis_url)
    prefix = unique("p")  # the same for both deployments, as in the report
    nodes = [start_node(u, bootstrap, tmp_path, key_prefix=prefix) for u in (url_a, url_b)]
    try:
        async def main() -> None:
            ra, rb = aioredis.Redis.from_url(url_a), aioredis.Redis.from_url(url_b)
            try:
                a, b = OffsetStore(ra, prefix), OffsetStore(rb, prefix)
                channel_a, channel_b = a.registry.changes.channel, b.registry.changes.channel
                assert channel_a != channel_b
                # each deployment's one worker listens on its own channel, and only there
                _wait_subscribed(redis.Redis.from_url(url_a), {channel_a: 1, channel_b: 1})

                acks = f"{prefix}:{{reg}}:acks:*"
                got = await a.registry.changes.announce()
                # reached: the one process of its own deployment (before: both, and the write
                # waited 2 s for an acknowledgement that went to the other database)
                assert (got.reached, got.acknowledged) == (1, 1), got
                assert [k async for k in rb.scan_iter(match=acks)] == []  # nothing arrived there
                # the other deployment's first write has the same version number: before, the
                # acknowledgement of a notice it never sent could already be waiting for it
                got_b = await b.registry.changes.announce()
                assert got_b.version == got.version
                assert (got_b.reached, got_b.acknowledged) == (1, 1), got_b
                for r in (ra, rb):  # one acknowledgement each, by its own process
                    assert await r.scard(a.layout.registry_acks(got.version)) == 1
            finally:
                await ra.aclose()
                await rb.aclose()
        asyncio.run(main())
    finally:
        for n in nodes:
            n.stop()


def test_delay_pokes_stay_in_their_database(redis_url: str) -> None:
    from gateway.store import OffsetStore

    url_a, url_b = _two_databases(redis_url)
    prefix = unique("p")

    async def main() -> None:
        ra, rb = aioredis.Redis.from_url(url_a), aioredis.Redis.from_url(url_b)
        got: list[dict[str, dict[str, int]]] = []
        a, b = OffsetStore(ra, prefix), OffsetStore(rb, prefix)
        listener = asyncio.create_task(a.delay.listen(got.append))
        try:
            assert a.layout.delay_poke() != b.layout.delay_poke()
            deadline = time.monotonic() + 10
            while int(dict(await ra.pubsub_numsub(a.layout.delay_poke()))[
                    a.layout.delay_poke().encode()]) < 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            await b.delay.poke({"mqgw.delay.other": {"0": 7}})  # the other deployment's relay
            await a.delay.poke({"mqgw.delay.mine": {"0": 3}})
            while not got:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert got == [{"mqgw.delay.mine": {"0": 3}}]  # published in order: b's came first
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await ra.aclose()
            await rb.aclose()
    asyncio.run(main())
