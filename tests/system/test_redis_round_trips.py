"""A lock and an ack are one Redis round trip each, as a real redis-server sees them (MONITOR).

The offset store's rules themselves (choose, lock, ack, broadcast, pause, rate limit) are proven
in process on fakeredis: tests/unit/test_offsets.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from gateway.store import Lock, OffsetStore

from ..support import Monitor, unique

T = "topic-a"
DEFAULTS: dict[str, Any] = dict(address="1.2.3.4:5", default_timeout_ms=60_000,
                                default_start="latest", client_idle_ms=3_600_000)


def run(redis_url: str, fn: Callable[[OffsetStore], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        r = aioredis.Redis.from_url(redis_url)
        try:
            return await fn(OffsetStore(r, "mqgw"))
        finally:
            await r.aclose()
    return asyncio.run(main())


def test_choose_and_ack_are_one_round_trip_each(redis_url: str, rds: redis.Redis) -> None:
    g = unique()

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest"})
        await s.choose(g, "", T, {"0": (0, 1)}, **DEFAULTS)  # loads the scripts, opens the connection
        await s.ack(g, "", T, "0", 0, 0, 0, default_timeout_ms=1)
        sent: list[str] = []
        real = s.redis.execute_command

        async def counting(*args: Any, **kw: Any) -> Any:
            sent.append(str(args[0]))
            return await real(*args, **kw)
        s.redis.execute_command = counting  # type: ignore[method-assign]
        with Monitor(redis_url) as mon:  # what the server saw of this consumer (the session's
            lock = await s.choose(g, "", T, {"0": (0, 1), "1": (0, 2)}, **DEFAULTS)  # other
            assert isinstance(lock, Lock)  # nodes use the same Redis)
            assert sent == ["EVALSHA"]
            await s.ack(g, "", T, lock.queue, lock.committed, lock.committed + 1, lock.token,
                        default_timeout_ms=60_000)
            assert sent == ["EVALSHA", "EVALSHA"]
        mine = [c.split(" ", 1)[0] for c in mon.lines if g in c]
        assert mine == ["EVALSHA", "EVALSHA"]  # and the server saw exactly those two
    run(redis_url, body)
