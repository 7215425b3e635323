"""The offset store (store/offsets.py and its scripts choose.lua, ack.lua, unlock.lua, reset.lua,
refund.lua): lock, ack, stale acks, redelivery, broadcast offsets, pause and rate limits, each
decided by the real Lua script on fakeredis. Times are passed as ``now`` or moved with the
``clock`` fixture; nothing sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.store import Lock, NoQueue, OffsetStore, Paused, RateLimited

from .conftest import Clock

pytestmark = pytest.mark.anyio

T = "topic-a"
G = "g1"
DEFAULTS: dict[str, Any] = dict(address="1.2.3.4:5", default_timeout_ms=60_000,
                                default_start="latest", client_idle_ms=3_600_000)


async def test_key_names_carry_the_consumer_hash_tag(store: OffsetStore) -> None:
    assert store.queues_key("g1") == "mqgw:{g1}:q"
    assert store.queues_key("g1", "c1") == "mqgw:{g1}:q:c1"
    assert store.config_key("g1") == "mqgw:{g1}:cfg"
    assert store.clients_key("g1") == "mqgw:{g1}:clients"


async def test_new_consumer_starts_latest_or_earliest(store: OffsetStore) -> None:
    wm = {"0": (5, 10), "1": (0, 3)}
    assert isinstance(await store.choose("g1", "", T, wm, **DEFAULTS), NoQueue)  # latest: no backlog
    await store.set_config("g2", {"start": "earliest"})
    lock = await store.choose("g2", "", T, wm, **DEFAULTS)
    assert isinstance(lock, Lock) and lock.queue == "0" and lock.committed == 5  # backlog 5 > 3
    states = {q.queue: q for q in await store.queue_states("g1")}
    assert (states["0"].committed, states["0"].max_offset) == (10, 10)


async def test_choose_prefers_largest_backlog_then_least_recently_used(store: OffsetStore) -> None:
    await store.set_config(G, {"start": "earliest"})
    wm = {"0": (0, 5), "1": (0, 9), "2": (0, 9)}
    first = await store.choose(G, "", T, wm, **DEFAULTS, now=1000)
    assert isinstance(first, Lock) and first.queue in ("1", "2")
    second = await store.choose(G, "", T, wm, **DEFAULTS, now=1001)
    assert isinstance(second, Lock) and {first.queue, second.queue} == {"1", "2"}
    third = await store.choose(G, "", T, wm, **DEFAULTS, now=1002)
    assert isinstance(third, Lock) and third.queue == "0"
    none = await store.choose(G, "", T, wm, **DEFAULTS, now=1003)
    assert isinstance(none, NoQueue) and none.wake_ms == 1000 + 60_000
    r = await store.ack(G, "", T, first.queue, 0, 9, first.token, default_timeout_ms=60_000, now=2000)
    assert r.result == "committed"
    r = await store.ack(G, "", T, second.queue, 0, 4, second.token, default_timeout_ms=60_000, now=2001)
    assert r.result == "committed"
    await store.unlock(G, "", T, "0", third.token)
    nxt = await store.choose(G, "", T, wm, **DEFAULTS, now=3000)
    # equal backlog 5: the least recently accessed queue wins (0 at 1002, the other at 2001)
    assert isinstance(nxt, Lock) and nxt.queue == "0"


async def test_lock_is_exclusive_until_it_expires_then_redelivers(store: OffsetStore) -> None:
    await store.set_config(G, {"start": "earliest", "consume_timeout_ms": 1000})
    wm = {"0": (0, 10)}
    a = await store.choose(G, "", T, wm, **DEFAULTS, now=10_000)
    assert isinstance(a, Lock) and a.previous_lock_ms == 0 and a.timeout_ms == 1000
    assert isinstance(await store.choose(G, "", T, wm, **DEFAULTS, now=10_999), NoQueue)
    b = await store.choose(G, "", T, wm, **DEFAULTS, now=11_000)
    assert isinstance(b, Lock) and b.committed == 0 and b.token == a.token + 1
    assert b.previous_lock_ms == 10_000  # a redelivery of the expired batch
    r = await store.ack(G, "", T, "0", 0, 10, a.token, default_timeout_ms=60_000, now=11_001)
    assert (r.result, r.committed) == ("lock_lost", 0)  # a's ack is stale: the lock was retaken
    r = await store.ack(G, "", T, "0", 0, 10, b.token, default_timeout_ms=60_000, now=11_002)
    assert (r.result, r.committed, r.lock_state) == ("committed", 10, "held")
    for tok in (a.token, b.token):  # repeating either ack changes nothing
        r = await store.ack(G, "", T, "0", 0, 10, tok, default_timeout_ms=60_000)
        assert (r.result, r.committed) == ("already_committed", 10)


async def test_late_ack_commits_when_nobody_took_the_lock(store: OffsetStore) -> None:
    await store.set_config(G, {"start": "earliest", "consume_timeout_ms": 1000})
    a = await store.choose(G, "", T, {"0": (0, 10)}, **DEFAULTS, now=10_000)
    assert isinstance(a, Lock)
    r = await store.ack(G, "", T, "0", 0, 7, a.token, default_timeout_ms=60_000, now=50_000)
    assert (r.result, r.committed, r.lock_state) == ("committed", 7, "expired")
    states = await store.queue_states(G)
    assert states[0].committed == 7 and states[0].lock_ms == 0


async def test_ack_after_unlock_and_offset_mismatch_and_unknown(store: OffsetStore) -> None:
    await store.set_config(G, {"start": "earliest"})
    a = await store.choose(G, "", T, {"0": (0, 10)}, **DEFAULTS)
    assert isinstance(a, Lock)
    assert await store.unlock(G, "", T, "0", a.token) == ("unlocked", 0)
    assert await store.unlock(G, "", T, "0", a.token) == ("not_locked", 0)
    assert await store.unlock(G, "", T, "0", a.token + 5) == ("lock_lost", 0)
    r = await store.ack(G, "", T, "0", 0, 3, a.token, default_timeout_ms=60_000)
    assert (r.result, r.lock_state) == ("committed", "released")  # nobody took it after the unlock
    b = await store.choose(G, "", T, {"0": (0, 10)}, **DEFAULTS)
    assert isinstance(b, Lock) and b.committed == 3
    # a batch that does not start at the committed offset never commits
    r = await store.ack(G, "", T, "0", 2, 9, b.token, default_timeout_ms=60_000)
    assert (r.result, r.committed) == ("offset_mismatch", 3)
    assert (await store.ack(G, "", T, "9", 0, 1, 1, default_timeout_ms=60_000)).result == "unknown"
    assert (await store.ack("other", "", T, "0", 0, 1, 1, default_timeout_ms=60_000)).result \
        == "unknown"


async def test_check_only_ack_decides_but_commits_nothing(store: OffsetStore) -> None:
    await store.set_config(G, {"start": "earliest"})
    a = await store.choose(G, "", T, {"0": (0, 10)}, **DEFAULTS)
    assert isinstance(a, Lock)
    r = await store.ack(G, "", T, "0", 0, 4, a.token, default_timeout_ms=60_000, check_only=True)
    assert r.result == "committed"
    assert (await store.queue_states(G))[0].committed == 0
    assert (await store.ack(G, "", T, "0", 0, 4, a.token, default_timeout_ms=60_000)).committed == 4


async def test_max_offset_never_goes_down(store: OffsetStore) -> None:
    await store.set_config(G, {"start": "earliest"})
    await store.choose(G, "", T, {"0": (0, 50)}, **DEFAULTS)
    await store.choose(G, "", T, {"0": (0, 20)}, **DEFAULTS)  # a lagging ListOffsets answer
    assert (await store.queue_states(G))[0].max_offset == 50
    await store.ack(G, "", T, "0", 0, 1, 1, default_timeout_ms=60_000, high_watermark=70)
    assert (await store.queue_states(G))[0].max_offset == 70
    await store.unlock(G, "", T, "0", 1, high_watermark=60)
    assert (await store.queue_states(G))[0].max_offset == 70


async def test_broadcast_clients_have_own_offsets_and_expire(store: OffsetStore, clock: Clock) -> None:
    wm = {"0": (0, 4)}
    await store.set_config(G, {"start": "earliest"})
    kw = {**DEFAULTS, "client_idle_ms": 1000}
    a = await store.choose(G, "c1", T, wm, **kw)
    b = await store.choose(G, "c2", T, wm, **kw)
    assert isinstance(a, Lock) and isinstance(b, Lock) and a.committed == b.committed == 0
    assert (await store.ack(G, "c1", T, "0", 0, 4, a.token, default_timeout_ms=60_000)).committed == 4
    assert [q.committed for q in await store.queue_states(G, "c2")] == [0]  # c2 has its own
    assert [c for c, _ in await store.clients(G)] == ["c1", "c2"]
    assert 0 < await store.redis.pttl(store.queues_key(G, "c1")) <= 1000
    clock.advance(1100)
    assert not await store.redis.exists(store.queues_key(G, "c1"))
    await store.choose(G, "c3", T, wm, **kw)  # any access prunes idle clientIds
    assert [c for c, _ in await store.clients(G)] == ["c3"]


async def test_concurrent_chooses_never_double_lock(store: OffsetStore) -> None:
    wm = {str(i): (0, 100) for i in range(4)}
    await store.set_config(G, {"start": "earliest"})
    locks = await asyncio.gather(*(store.choose(G, "", T, wm, **DEFAULTS) for _ in range(50)))
    assert sorted(lk.queue for lk in locks if isinstance(lk, Lock)) == ["0", "1", "2", "3"]


async def test_a_paused_broadcast_client_that_keeps_polling_keeps_its_offsets(
        store: OffsetStore, clock: Clock) -> None:
    """Idle clientIds expire; a polling one must not, also while its consumer is paused: its
    offsets would start over at `start` after the resume, skipping records."""
    wm = {"0": (0, 30)}
    await store.set_config(G, {"start": "latest"})
    kw = {**DEFAULTS, "client_idle_ms": 1000}
    await store.reset(G, "c1", T, {"0": 10})
    lock = await store.choose(G, "c1", T, wm, **kw)
    assert isinstance(lock, Lock) and lock.committed == 10
    assert (await store.ack(G, "c1", T, "0", 10, 15, lock.token, default_timeout_ms=60_000)).result \
        == "committed"
    await store.set_config(G, {"paused": 1})
    for _ in range(15):  # 1.5 s of polling, paused: well past the 1 s idle time
        assert isinstance(await store.choose(G, "c1", T, wm, **kw), Paused)
        clock.advance(100)
    assert await store.redis.exists(store.queues_key(G, "c1"))
    assert [c for c, _ in await store.clients(G)] == ["c1"]
    await store.set_config(G, {"paused": 0})
    again = await store.choose(G, "c1", T, wm, **kw)
    assert isinstance(again, Lock) and again.committed == 15  # not 30 ("latest")


async def test_tokens_of_a_recreated_hash_never_repeat(store: OffsetStore, clock: Clock) -> None:
    """A requestId fetched before the consumer's offsets were deleted must not commit over the
    new holder of the same queue, even at the same offset."""
    wm = {"0": (0, 50)}
    await store.set_config(G, {"start": "earliest"})
    old = await store.choose(G, "", T, wm, **DEFAULTS, now=1_795_000_000_000)
    assert isinstance(old, Lock) and old.committed == 0
    await store.redis.delete(store.queues_key(G))  # DELETE /admin/consumers/{g}?deleteOffsets=true
    clock.advance(1)  # the seed is Redis' clock in ms x 1000: a later ms
    tokens = []
    for i in range(3):  # the old token count reached again: tokens would have restarted at 1
        new = await store.choose(G, "", T, wm, **DEFAULTS, now=1_795_000_000_500 + i * 70_000)
        assert isinstance(new, Lock) and new.committed == 0
        tokens.append(new.token)
    assert min(tokens) > old.token
    assert (await store.ack(G, "", T, "0", 0, 10, old.token, default_timeout_ms=60_000)).result \
        == "lock_lost"
    assert (await store.ack(G, "", T, "0", 0, 10, tokens[-1], default_timeout_ms=60_000)).result \
        == "committed"
    # a reset that creates the queue's fields also seeds from the clock, as exact digits
    await store.reset("g2", "", T, {"0": 7})
    raw = await store.redis.hget(store.queues_key("g2"), f"{T}:0:rtok")
    assert isinstance(raw, bytes)
    rtok = raw.decode()
    assert rtok.isdigit() and int(rtok) > 1_700_000_000_000_000
    lock = await store.choose("g2", "", T, wm, **DEFAULTS)
    assert isinstance(lock, Lock) and lock.committed == 7 and lock.token == int(rtok) + 1


async def test_rate_limit_bucket_refills_on_redis_clock(store: OffsetStore, clock: Clock) -> None:
    """The token bucket lives in Redis and refills on its TIME: `rate` per second up to `burst`;
    an empty bucket answers RateLimited with when the next token is due."""
    clock.freeze()
    wm = {"0": (0, 1000)}
    await store.set_config(G, {"start": "earliest", "rate": 2, "burst": 4})
    first = await store.choose(G, "", T, wm, **DEFAULTS, max_messages=10)
    assert isinstance(first, Lock) and first.charged and first.allowance == 4  # the whole burst
    await store.unlock(G, "", T, "0", first.token)
    limited = await store.choose(G, "", T, wm, **DEFAULTS)
    assert limited == RateLimited(500)  # 1 token at 2/s
    clock.advance(1000)  # two tokens
    again = await store.choose(G, "", T, wm, **DEFAULTS, max_messages=10)
    assert isinstance(again, Lock) and again.allowance == 2
    await store.unlock(G, "", T, "0", again.token)
    clock.advance(60_000)  # never more than the burst
    full = await store.choose(G, "", T, wm, **DEFAULTS, max_messages=10)
    assert isinstance(full, Lock) and full.allowance == 4


async def test_a_short_read_gets_its_rate_limit_tokens_back(store: OffsetStore) -> None:
    wm = {"0": (0, 100), "1": (0, 5)}
    await store.set_config(G, {"start": "earliest", "rate": 10, "burst": 10})
    big = await store.choose(G, "", T, wm, **DEFAULTS)
    assert isinstance(big, Lock) and big.queue == "0" and big.allowance == 10 and big.charged
    assert await store.redis.hget(store.bucket_key(G), "tokens") == b"0"
    # queue 0 read nothing (an open transaction, say): all 10 come back, capped at the burst
    assert await store.refund(G, 10) == 10
    assert await store.refund(G, 10) == 10
    await store.unlock(G, "", T, "0", big.token)
    small = await store.choose(G, "", T, wm, **DEFAULTS, skip={"0"})
    assert isinstance(small, Lock) and small.queue == "1" and small.allowance == 5
    # without a rate limit nothing is charged, and a refund changes nothing
    await store.set_config("g2", {"start": "earliest"})
    free = await store.choose("g2", "", T, wm, **DEFAULTS)
    assert isinstance(free, Lock) and not free.charged and free.allowance >= 100
    assert await store.refund("g2", 5) == -1 and not await store.redis.exists(store.bucket_key("g2"))


async def test_reset_sets_offsets_and_a_held_batch_can_no_longer_commit(store: OffsetStore) -> None:
    wm = {"0": (0, 50), "1": (0, 50)}
    await store.set_config(G, {"start": "earliest"})
    held = await store.choose(G, "", T, wm, **DEFAULTS)
    assert isinstance(held, Lock)
    moved = await store.reset(G, "", T, {held.queue: 30})
    assert moved == [(held.queue, 0, 30)]
    r = await store.ack(G, "", T, held.queue, 0, 10, held.token, default_timeout_ms=60_000)
    assert (r.result, r.committed) == ("offset_reset", 30)
    nxt = await store.choose(G, "", T, wm, **DEFAULTS, skip={"0", "1"} - {held.queue})
    assert isinstance(nxt, Lock) and (nxt.queue, nxt.committed) == (held.queue, 30)


async def test_a_watermark_refresh_writes_only_the_queues_that_moved(store: OffsetStore) -> None:
    """The lease holder's refresh sends only queues ahead of the copy it has just read (at 4,096
    partitions writing all cost 9.8 ms of Redis every 200 ms); the copy is complete either way."""
    wm = {str(q): (0, 10) for q in range(50)}
    await store.write_watermarks(T, wm)
    _lease, stored, _ts = await store.read_watermarks(T, 1_000, "n1")
    sent: list[list[Any]] = []
    inner = store._wm_put

    async def spy(keys: list[str], args: list[Any]) -> Any:
        sent.append(list(args))
        return await inner(keys=keys, args=args)

    store._wm_put = spy  # type: ignore[assignment]
    fresh = {**wm, "7": (0, 12), "50": (0, 1), "3": (0, 9)}  # one moved, one new, one behind
    await store.write_watermarks(T, fresh, stored)
    assert sent[-1][2:] == ["7", 0, 12, "50", 0, 1]
    assert await store.shared_watermarks(T) == {**wm, "7": (0, 12), "50": (0, 1)}


async def test_a_watermark_read_gets_only_what_moved_since_the_copy_it_holds(
        store: OffsetStore) -> None:
    """A process that read the shared copy before reads only the queues that moved since
    (watermarks.lua's delta); partitions added come with the new list; a copy written by a
    gateway without versions (a rolling upgrade) is read whole."""
    wm = {str(q): (0, 10) for q in range(200)}
    await store.write_watermarks(T, wm)
    _, have, _ = await store.read_watermarks(T, 60_000, "n1")
    assert have.version is not None and have.queues == wm
    replies: list[Any] = []
    inner = store._wm_get

    async def spy(keys: list[str], args: list[Any]) -> Any:
        replies.append(r := await inner(keys=keys, args=args))
        return r

    store._wm_get = spy  # type: ignore[assignment]
    _, same, _ = await store.read_watermarks(T, 60_000, "n1", have)
    assert same.queues == wm and len(replies[-1]) == 5  # nothing moved: nothing read
    await store.write_watermarks(T, {**wm, "7": (2, 30)}, have)
    _, moved, _ = await store.read_watermarks(T, 60_000, "n1", same)
    assert moved.queues == {**wm, "7": (2, 30)} and replies[-1][5:] == [b"7", b"2", b"30"]
    await store.write_watermarks(T, {**moved.queues, "200": (0, 4)}, moved)  # a partition added
    _, grown, _ = await store.read_watermarks(T, 60_000, "n1", moved)
    assert grown.queues == {**moved.queues, "200": (0, 4)}
    assert grown.version is not None and moved.version is not None
    assert grown.version > moved.version
    # an older gateway's refresh: plain fields, no version
    await store.redis.hset(store.layout.watermarks(T), mapping={"ts": 123, "3:hi": 99})
    _, whole, _ = await store.read_watermarks(T, 60_000, "n1", grown)
    assert whole.queues["3"] == (0, 99) and replies[-1][1] == b"full"
    # ... and then a versioned one, before a reader that held `grown` looks again: the older
    # gateway's change is still read (that version counts every queue as moved)
    await store.write_watermarks(T, {**grown.queues, "4": (0, 50)}, whole)
    _, after, _ = await store.read_watermarks(T, 60_000, "n1", grown)
    assert after.queues["3"] == (0, 99) and after.queues["4"] == (0, 50)
    assert replies[-1][1] == b"delta"


async def test_the_refreshing_process_knows_the_version_it_wrote(store: OffsetStore) -> None:
    """The lease holder's next read is a delta too, unless another write came between."""
    wm = {str(q): (0, 10) for q in range(20)}
    await store.write_watermarks(T, wm)
    _, have, _ = await store.read_watermarks(T, 60_000, "n1")
    written = await store.write_watermarks(T, {**wm, "1": (0, 11)}, have)
    assert written.version is not None and written.version > (have.version or 0)
    assert written.queues["1"] == (0, 11)
    stale = await store.write_watermarks(T, {**wm, "2": (0, 12)}, have)  # "have" is old now
    assert stale.version is None
