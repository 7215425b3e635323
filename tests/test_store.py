"""Offset store semantics, each checked against a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from gateway.store import Lock, NoQueue, OffsetStore, Paused

from .helpers import Monitor, unique

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


def test_key_names_carry_the_group_hash_tag() -> None:
    s = OffsetStore(aioredis.Redis(), "mqgw")  # never connects: key names only
    assert s.queues_key("g1") == "mqgw:{g1}:q"
    assert s.queues_key("g1", "c1") == "mqgw:{g1}:q:c1"
    assert s.config_key("g1") == "mqgw:{g1}:cfg"
    assert s.clients_key("g1") == "mqgw:{g1}:clients"


def test_new_consumer_starts_latest_or_earliest(redis_url: str) -> None:
    g1, g2 = unique(), unique()
    wm = {"0": (5, 10), "1": (0, 3)}

    async def body(s: OffsetStore) -> None:
        assert isinstance(await s.choose(g1, "", T, wm, **DEFAULTS), NoQueue)  # latest: no backlog
        await s.set_config(g2, {"start": "earliest"})
        lock = await s.choose(g2, "", T, wm, **DEFAULTS)
        assert isinstance(lock, Lock) and lock.queue == "0" and lock.committed == 5  # backlog 5 > 3
        states = {q.queue: q for q in await s.queue_states(g1)}
        assert (states["0"].committed, states["0"].max_offset) == (10, 10)
    run(redis_url, body)


def test_choose_prefers_largest_backlog_then_least_recently_used(redis_url: str) -> None:
    g = unique()

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest"})
        wm = {"0": (0, 5), "1": (0, 9), "2": (0, 9)}
        first = await s.choose(g, "", T, wm, **DEFAULTS, now=1000)
        assert isinstance(first, Lock) and first.queue in ("1", "2")
        second = await s.choose(g, "", T, wm, **DEFAULTS, now=1001)
        assert isinstance(second, Lock) and {first.queue, second.queue} == {"1", "2"}
        third = await s.choose(g, "", T, wm, **DEFAULTS, now=1002)
        assert isinstance(third, Lock) and third.queue == "0"
        none = await s.choose(g, "", T, wm, **DEFAULTS, now=1003)
        assert isinstance(none, NoQueue) and none.wake_ms == 1000 + 60_000
        # Commit queue 1 fully and queue 2 partly; release 0 untouched.
        r = await s.ack(g, "", T, first.queue, 0, 9, first.token, default_timeout_ms=60_000, now=2000)
        assert r.result == "committed"
        r = await s.ack(g, "", T, second.queue, 0, 4, second.token, default_timeout_ms=60_000, now=2001)
        assert r.result == "committed"
        await s.unlock(g, "", T, "0", third.token)
        nxt = await s.choose(g, "", T, wm, **DEFAULTS, now=3000)
        assert isinstance(nxt, Lock) and nxt.queue in ("0", second.queue)  # equal backlog 5
        # ties go to the least recently accessed queue: 0 was accessed at 1002, the other at 2001
        assert nxt.queue == "0"
    run(redis_url, body)


def test_lock_is_exclusive_until_it_expires_then_redelivers(redis_url: str) -> None:
    g = unique()

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest", "consume_timeout_ms": 1000})
        wm = {"0": (0, 10)}
        a = await s.choose(g, "", T, wm, **DEFAULTS, now=10_000)
        assert isinstance(a, Lock) and a.previous_lock_ms == 0 and a.timeout_ms == 1000
        assert isinstance(await s.choose(g, "", T, wm, **DEFAULTS, now=10_999), NoQueue)
        b = await s.choose(g, "", T, wm, **DEFAULTS, now=11_000)
        assert isinstance(b, Lock) and b.committed == 0 and b.token == a.token + 1
        assert b.previous_lock_ms == 10_000  # a redelivery of the expired batch
        # a's ack is stale now: the lock was retaken
        r = await s.ack(g, "", T, "0", 0, 10, a.token, default_timeout_ms=60_000, now=11_001)
        assert (r.result, r.committed) == ("lock_lost", 0)
        r = await s.ack(g, "", T, "0", 0, 10, b.token, default_timeout_ms=60_000, now=11_002)
        assert (r.result, r.committed, r.lock_state) == ("committed", 10, "held")
        # repeating either ack changes nothing
        for tok in (a.token, b.token):
            r = await s.ack(g, "", T, "0", 0, 10, tok, default_timeout_ms=60_000)
            assert (r.result, r.committed) == ("already_committed", 10)
    run(redis_url, body)


def test_late_ack_commits_when_nobody_took_the_lock(redis_url: str) -> None:
    g = unique()

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest", "consume_timeout_ms": 1000})
        a = await s.choose(g, "", T, {"0": (0, 10)}, **DEFAULTS, now=10_000)
        assert isinstance(a, Lock)
        r = await s.ack(g, "", T, "0", 0, 7, a.token, default_timeout_ms=60_000, now=50_000)
        assert (r.result, r.committed, r.lock_state) == ("committed", 7, "expired")
        states = await s.queue_states(g)
        assert states[0].committed == 7 and states[0].lock_ms == 0
    run(redis_url, body)


def test_ack_after_unlock_and_offset_mismatch_and_unknown(redis_url: str) -> None:
    g = unique()

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest"})
        a = await s.choose(g, "", T, {"0": (0, 10)}, **DEFAULTS)
        assert isinstance(a, Lock)
        assert await s.unlock(g, "", T, "0", a.token) == ("unlocked", 0)
        assert await s.unlock(g, "", T, "0", a.token) == ("not_locked", 0)
        assert await s.unlock(g, "", T, "0", a.token + 5) == ("lock_lost", 0)
        # nobody took it after the unlock: the ack still commits
        r = await s.ack(g, "", T, "0", 0, 3, a.token, default_timeout_ms=60_000)
        assert (r.result, r.lock_state) == ("committed", "released")
        b = await s.choose(g, "", T, {"0": (0, 10)}, **DEFAULTS)
        assert isinstance(b, Lock) and b.committed == 3
        # a batch that does not start at the committed offset never commits
        r = await s.ack(g, "", T, "0", 2, 9, b.token, default_timeout_ms=60_000)
        assert (r.result, r.committed) == ("offset_mismatch", 3)
        r = await s.ack(g, "", T, "9", 0, 1, 1, default_timeout_ms=60_000)
        assert r.result == "unknown"
        r = await s.ack(unique(), "", T, "0", 0, 1, 1, default_timeout_ms=60_000)
        assert r.result == "unknown"
    run(redis_url, body)


def test_max_offset_never_goes_down(redis_url: str) -> None:
    g = unique()

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest"})
        await s.choose(g, "", T, {"0": (0, 50)}, **DEFAULTS)
        await s.choose(g, "", T, {"0": (0, 20)}, **DEFAULTS)  # a lagging ListOffsets answer
        assert (await s.queue_states(g))[0].max_offset == 50
        await s.ack(g, "", T, "0", 0, 1, 1, default_timeout_ms=60_000, high_watermark=70)
        assert (await s.queue_states(g))[0].max_offset == 70
        await s.unlock(g, "", T, "0", 1, high_watermark=60)
        assert (await s.queue_states(g))[0].max_offset == 70
    run(redis_url, body)


def test_broadcast_clients_have_own_offsets_and_expire(redis_url: str, rds: redis.Redis) -> None:
    g = unique()
    wm = {"0": (0, 4)}

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest"})
        # 1 s: no stall of a loaded machine between the calls below lets c1 expire early
        kw = {**DEFAULTS, "client_idle_ms": 1000}
        a = await s.choose(g, "c1", T, wm, **kw)
        b = await s.choose(g, "c2", T, wm, **kw)
        assert isinstance(a, Lock) and isinstance(b, Lock) and a.committed == b.committed == 0
        assert [c for c, _ in await s.clients(g)] == ["c1", "c2"]
        assert 0 < rds.pttl(s.queues_key(g, "c1")) <= 1000
        await asyncio.sleep(1.1)
        assert not rds.exists(s.queues_key(g, "c1"))
        await s.choose(g, "c3", T, wm, **kw)  # any access prunes idle clientIds
        assert [c for c, _ in await s.clients(g)] == ["c3"]
    run(redis_url, body)


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


@pytest.mark.timeout(60)
def test_concurrent_chooses_never_double_lock(redis_url: str) -> None:
    g = unique()
    wm = {str(i): (0, 100) for i in range(4)}

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest"})
        locks = await asyncio.gather(*(s.choose(g, "", T, wm, **DEFAULTS) for _ in range(50)))
        got = [lk.queue for lk in locks if isinstance(lk, Lock)]
        assert sorted(got) == ["0", "1", "2", "3"]
    run(redis_url, body)


def test_a_paused_broadcast_client_that_keeps_polling_keeps_its_offsets(
        redis_url: str, rds: redis.Redis) -> None:
    """Idle clientIds expire; a polling one must not, also while its consumer is paused (or
    rate limited): its offsets would start over at `start` after the resume, skipping records."""
    g = unique()
    wm = {"0": (0, 30)}

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "latest"})
        kw = {**DEFAULTS, "client_idle_ms": 1000}  # 1 s: longer than any stall between two polls
        await s.reset(g, "c1", T, {"0": 10})
        lock = await s.choose(g, "c1", T, wm, **kw)
        assert isinstance(lock, Lock) and lock.committed == 10
        assert (await s.ack(g, "c1", T, "0", 10, 15, lock.token, default_timeout_ms=60_000)).result \
            == "committed"
        await s.set_config(g, {"paused": 1})
        for _ in range(15):  # 1.5 s of polling, paused: well past the 1 s idle time
            assert isinstance(await s.choose(g, "c1", T, wm, **kw), Paused)
            await asyncio.sleep(0.1)
        assert rds.exists(s.queues_key(g, "c1"))
        assert [c for c, _ in await s.clients(g)] == ["c1"]
        await s.set_config(g, {"paused": 0})
        again = await s.choose(g, "c1", T, wm, **kw)
        assert isinstance(again, Lock) and again.committed == 15  # not 30 ("latest")
    run(redis_url, body)


def test_tokens_of_a_recreated_hash_never_repeat(redis_url: str, rds: redis.Redis) -> None:
    """A requestId fetched before the consumer's offsets were deleted must not commit over the
    new holder of the same queue, even at the same offset."""
    g = unique()
    wm = {"0": (0, 50)}

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest"})
        old = await s.choose(g, "", T, wm, **DEFAULTS, now=1_795_000_000_000)
        assert isinstance(old, Lock) and old.committed == 0
        rds.delete(s.queues_key(g))  # DELETE /admin/consumers/{g}?deleteOffsets=true
        new = None
        for i in range(3):  # the old token count reached again: tokens would have restarted at 1
            new = await s.choose(g, "", T, wm, **DEFAULTS, now=1_795_000_000_500 + i * 70_000)
            assert isinstance(new, Lock) and new.committed == 0
        assert new is not None and new.token > old.token
        stale = await s.ack(g, "", T, "0", 0, 10, old.token, default_timeout_ms=60_000)
        assert stale.result == "lock_lost"
        assert (await s.ack(g, "", T, "0", 0, 10, new.token, default_timeout_ms=60_000)).result \
            == "committed"
        # a reset that creates the queue's fields also starts from the clock, and stores the
        # reset token as exact digits (a Lua number that large would be written as 1.79e+15)
        g2 = unique()
        await s.reset(g2, "", T, {"0": 7})
        rtok = rds.hget(s.queues_key(g2), f"{T}:0:rtok").decode()
        assert rtok.isdigit() and int(rtok) > 1_700_000_000_000_000
        lock = await s.choose(g2, "", T, wm, **DEFAULTS)
        assert isinstance(lock, Lock) and lock.committed == 7 and lock.token == int(rtok) + 1
        assert (await s.ack(g2, "", T, "0", 7, 9, lock.token, default_timeout_ms=60_000)).result \
            == "committed"
    run(redis_url, body)


def test_a_short_read_gets_its_rate_limit_tokens_back(redis_url: str, rds: redis.Redis) -> None:
    g = unique()
    wm = {"0": (0, 100), "1": (0, 5)}

    async def body(s: OffsetStore) -> None:
        await s.set_config(g, {"start": "earliest", "rate": 10, "burst": 10})
        big = await s.choose(g, "", T, wm, **DEFAULTS)
        assert isinstance(big, Lock) and big.queue == "0" and big.allowance == 10 and big.charged
        assert float(rds.hget(s.bucket_key(g), "tokens")) == 0
        # queue 0 read nothing (an open transaction, say): all 10 come back, capped at the burst
        assert await s.refund(g, 10) == 10
        assert await s.refund(g, 10) == 10
        await s.unlock(g, "", T, "0", big.token)
        small = await s.choose(g, "", T, wm, **DEFAULTS, skip={"0"})
        assert isinstance(small, Lock) and small.queue == "1" and small.allowance == 5
        # without a rate limit nothing is charged, and a refund changes nothing
        g2 = unique()
        await s.set_config(g2, {"start": "earliest"})
        free = await s.choose(g2, "", T, wm, **DEFAULTS)
        assert isinstance(free, Lock) and not free.charged and free.allowance >= 100
        assert await s.refund(g2, 5) == -1 and not rds.exists(s.bucket_key(g2))
    run(redis_url, body)
