"""Choosing from the queue indexes (choose.lua's delta path, store/marks.py) decides what the scan
of every queue decides; the request carries only what changed; what a gateway that does not keep
the indexes wrote is noticed and healed. Real scripts on fakeredis; times passed as ``now``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.store import Lock, NoQueue, OffsetStore
from gateway.store.marks import MarkLog

from .conftest import Clock

pytestmark = pytest.mark.anyio

T = "t"
TIMEOUT = 1_000
DEFAULTS: dict[str, Any] = dict(address="a", default_timeout_ms=TIMEOUT, default_start="earliest",
                                client_idle_ms=3_600_000)


def args_sent(store: OffsetStore) -> list[list[Any]]:
    """Record the arguments of every choose.lua call ``store`` makes."""
    calls: list[list[Any]] = []
    inner = store._choose

    async def spy(keys: list[str], args: list[Any]) -> Any:
        calls.append(list(args))
        return await inner(keys=keys, args=args)

    store._choose = spy  # type: ignore[assignment]
    return calls


def decision(r: object) -> tuple[Any, ...]:
    if isinstance(r, Lock):
        return ("lock", r.queue, r.committed, r.max_offset, r.previous_lock_ms, r.allowance,
                r.charged, r.redeliver_below)
    assert isinstance(r, NoQueue), r
    return ("none", r.wake_ms)


@pytest.mark.parametrize("client", ["", "c1"])
@pytest.mark.parametrize("seed", range(6))
async def test_the_indexes_decide_what_the_scan_decides(store: OffsetStore, seed: int,
                                                        client: str) -> None:
    """Two consumers, one always scanned (a dict of watermarks), one served from its indexes (a
    MarkLog), see the same records, acks, unlocks, extends, expiries, skips and resets: every
    decision is the same, down to the takeover flag and the handed-out mark; in cluster mode
    and as a broadcast clientId, with and without a rate limit."""
    rnd = random.Random(seed)
    if seed % 2:  # a rate limit: the allowance (and what is charged) is decided the same way
        for name in ("scan", "index"):
            await store.set_config(name, {"rate": 1_000_000, "burst": 7})
    queues = [str(i) for i in range(12)]
    log = MarkLog({q: (0, 0) for q in queues})
    scanned, indexed = "scan", "index"
    now = 1_000_000
    held: dict[str, dict[str, Lock]] = {scanned: {}, indexed: {}}
    sent = args_sent(store)
    for _step in range(400):
        op = rnd.random()
        now += rnd.choice((1, 5, 50, 400))
        if op < 0.25:  # records arrive
            moved = rnd.sample(queues, rnd.randint(1, 4))
            log.update({**log.queues, **{q: (0, log.queues[q][1] + rnd.randint(1, 5))
                                         for q in moved}}, moved)
        elif op < 0.6:
            skip = set(rnd.sample(queues, rnd.choice((0, 0, 1, 3))))
            want = rnd.choice((1, 3, 100))
            a = await store.choose(scanned, client, T, dict(log.queues), **DEFAULTS, now=now,
                                   skip=skip, max_messages=want)
            b = await store.choose(indexed, client, T, log, **DEFAULTS, now=now, skip=skip,
                                   max_messages=want)
            da, db = decision(a), decision(b)
            if da[0] == "none" and skip:
                # with a skip list the scan's wake leaves out skipped queues; the indexes' wake
                # is the first held lock's: at most as late (-1: never)
                assert db[0] == "none"
                assert da[1] == -1 or 0 <= db[1] <= da[1]
            else:
                assert da == db, (_step, skip)
            for name, r in ((scanned, a), (indexed, b)):
                if isinstance(r, Lock):
                    held[name][r.queue] = r
        elif op < 0.85 and held[scanned]:
            q = rnd.choice(sorted(held[scanned]))
            kind = rnd.random()
            first = held[scanned][q]
            n = rnd.randint(1, max(1, min(first.allowance, first.max_offset - first.committed)))
            for name in (scanned, indexed):
                lock = held[name].pop(q)
                if kind < 0.6:
                    await store.ack(name, client, T, q, lock.committed, lock.committed + n,
                                    lock.token, default_timeout_ms=TIMEOUT, now=now)
                elif kind < 0.85:
                    await store.unlock(name, client, T, q, lock.token,
                                       handed_out_to=lock.committed + 1)
                else:
                    await store.extend(name, client, T, q, lock.committed, lock.committed + 1,
                                       lock.token, default_timeout_ms=TIMEOUT, now=now)
                    held[name][q] = lock
        elif op < 0.87:
            q = rnd.choice(queues)
            to = rnd.randint(0, log.queues[q][1])
            for name in (scanned, indexed):
                await store.reset(name, client, T, {q: to}, client_idle_ms=3_600_000)
                held[name].pop(q, None)
    deltas = [a for a in sent if a[15] == "delta"]
    assert len(deltas) > 100  # the indexed consumer was mostly served from its indexes
    assert any(len(a) == 21 for a in deltas)  # ... many times with no watermark at all


async def test_a_request_carries_only_the_watermarks_that_changed(store: OffsetStore) -> None:
    log = MarkLog({str(q): (0, 10) for q in range(1_000)})
    sent = args_sent(store)
    assert isinstance(await store.choose("g", "", T, log, **DEFAULTS, now=1), Lock)
    assert sent[-1][15] == "full" and len(sent[-1]) == 21 + 3 * 1_000  # first: every queue
    assert isinstance(await store.choose("g", "", T, log, **DEFAULTS, now=2), Lock)
    assert sent[-1][15] == "delta" and len(sent[-1]) == 21  # nothing moved: nothing sent
    log.update({**log.queues, "7": (0, 50)}, ["7"])
    lock = await store.choose("g", "", T, log, **DEFAULTS, now=3)
    assert sent[-1][15] == "delta" and sent[-1][21:] == ["7", 0, 50]
    assert isinstance(lock, Lock) and lock.queue == "7" and lock.max_offset == 50
    assert len(sent) == 3  # one script call each


async def test_a_hash_that_absorbed_less_than_the_node_thinks_gets_every_queue(
        store: OffsetStore) -> None:
    """Redis lost the index state (or the consumer's offsets were deleted): the delta request
    is answered "send all" and the same call sends every queue."""
    log = MarkLog({str(q): (0, 5) for q in range(8)})
    sent = args_sent(store)
    await store.choose("g", "", T, log, **DEFAULTS, now=1)
    await store.redis.flushall()
    lock = await store.choose("g", "", T, log, **DEFAULTS, now=2)
    assert [a[15] for a in sent] == ["full", "delta", "full"]
    assert isinstance(lock, Lock) and lock.committed == 0  # offsets started again at earliest


async def test_an_ack_by_a_gateway_without_the_indexes_frees_the_queue_when_its_lock_expires(
        store: OffsetStore) -> None:
    """A rolling upgrade: an older gateway commits with plain hash writes (no index). The queue
    waits in the lock index until its lock would have run out, then is chosen again: nothing is
    lost, and the periodic rebuild heals what remains."""
    log = MarkLog({"0": (0, 10)})
    lock = await store.choose("g", "", T, log, **DEFAULTS, now=1_000, max_messages=4)
    assert isinstance(lock, Lock)
    key = store.queues_key("g")
    await store.redis.hset(key, mapping={"t:0:com": 4, "t:0:lock": 0, "t:0:acc": 1_001})
    assert isinstance(await store.choose("g", "", T, log, **DEFAULTS, now=1_002), NoQueue)
    again = await store.choose("g", "", T, log, **DEFAULTS, now=1_000 + TIMEOUT)
    assert isinstance(again, Lock) and again.committed == 4 and again.previous_lock_ms == 0


async def test_a_lock_taken_by_a_gateway_without_the_indexes_is_respected(
        store: OffsetStore) -> None:
    log = MarkLog({"0": (0, 10), "1": (0, 5)})
    await store.choose("g", "", T, log, **DEFAULTS, now=1_000, max_messages=1)  # locks 0
    lock1 = await store.choose("g", "", T, log, **DEFAULTS, now=1_001, max_messages=1)
    assert isinstance(lock1, Lock) and lock1.queue == "1"
    await store.ack("g", "", T, "1", 0, 1, lock1.token, default_timeout_ms=TIMEOUT, now=1_002)
    # an older gateway locks queue 1 (ready in the index) with plain hash writes
    await store.redis.hset(store.queues_key("g"), mapping={"t:1:lock": 1_003, "t:1:tok": 1})
    assert isinstance(await store.choose("g", "", T, log, **DEFAULTS, now=1_004), NoQueue)


async def test_the_indexes_are_rebuilt_when_old(store: OffsetStore, clock: Clock) -> None:
    """A rewind written by a gateway without the indexes (no index change) is seen at the next
    rebuild: the indexes are never trusted longer than ``index_rebuild_ms``."""
    log = MarkLog({"0": (0, 3)})
    lock = await store.choose("g", "", T, log, **DEFAULTS, now=1_000)
    assert isinstance(lock, Lock)
    await store.ack("g", "", T, "0", 0, 3, lock.token, default_timeout_ms=TIMEOUT, now=1_001)
    await store.redis.hset(store.queues_key("g"), "t:0:com", 1)  # an old gateway's rewind
    assert isinstance(await store.choose("g", "", T, log, **DEFAULTS, now=1_002), NoQueue)
    clock.advance(store.index_rebuild_ms)
    again = await store.choose("g", "", T, log, **DEFAULTS, now=1_003)
    assert isinstance(again, Lock) and again.committed == 1


async def test_broadcast_indexes_expire_with_the_client_offsets(store: OffsetStore) -> None:
    log = MarkLog({"0": (0, 3), "1": (0, 3)})
    lock = await store.choose("g", "c1", T, log, **{**DEFAULTS, "client_idle_ms": 50_000}, now=1)
    assert isinstance(lock, Lock)
    await store.ack("g", "c1", T, lock.queue, 0, 1, lock.token, default_timeout_ms=TIMEOUT, now=2)
    key = store.queues_key("g", "c1")
    names = [f"{key}:ir:{T}", f"{key}:il:{T}", f"{key}:ix:{T}"]
    assert await store.redis.exists(*names) >= 2
    for k in names:
        if await store.redis.exists(k):
            assert 0 < await store.redis.pttl(k) <= 50_000, k


async def test_index_keys_are_not_taken_for_queue_hashes(store: OffsetStore) -> None:
    """The snapshot's SCAN matches ``P:{G}:q*``: the index keys must not parse as queue hashes
    (they are deleted with the consumer's offsets: ``P:{G}:q:*``)."""
    for key in (store.queues_key("g"), store.queues_key("g", "c1")):
        for kind in ("ir", "il", "ix"):
            assert store.layout.parse_queue_key(f"{key}:{kind}:{T}") is None
    assert store.layout.parse_queue_key(store.queues_key("g", "c1")) == ("g", "c1")


async def test_the_relay_settle_keeps_the_indexes(store: OffsetStore) -> None:
    """relay_settle.lua frees a queue (it is chosen again at once, not after its lock would have
    run out) or parks it (its park time is the wake-up)."""
    log = MarkLog({"0": (0, 10)})
    key = store.queues_key("relay")
    lock = await store.choose("relay", "", T, log, **DEFAULTS, now=1_000, max_messages=2)
    assert isinstance(lock, Lock)
    await store.delay.settle(key, T, "0", 0, 2, lock.token, 0, TIMEOUT)
    again = await store.choose("relay", "", T, log, **DEFAULTS, now=1_001, max_messages=2)
    assert isinstance(again, Lock) and again.committed == 2
    await store.delay.settle(key, T, "0", 2, 4, again.token, 50_000, TIMEOUT)  # parked
    parked = await store.choose("relay", "", T, log, **DEFAULTS, now=1_002)
    assert isinstance(parked, NoQueue) and parked.wake_ms == 50_000
    due = await store.choose("relay", "", T, log, **DEFAULTS, now=50_000)
    assert isinstance(due, Lock) and due.committed == 4


async def test_concurrent_first_requests_send_every_queue_once(store: OffsetStore) -> None:
    """Consumers that start together wait for the first full request, then send only changes
    (each sending every queue cost 16 scans of 16 ms at 4,096 partitions)."""
    import asyncio

    log = MarkLog({str(q): (0, 10) for q in range(100)})
    sent = args_sent(store)
    locks = await asyncio.gather(*(store.choose("g", "", T, log, **DEFAULTS, max_messages=1)
                                   for _ in range(8)))
    assert len({lock.queue for lock in locks if isinstance(lock, Lock)}) == 8
    assert [a[15] for a in sent].count("full") == 1


def test_a_fetch_response_raises_one_queue_in_place() -> None:
    """Watermarks.observe's path: the copy changes in place (no copy of every queue), with a
    version whose change is that queue alone; a queue the copy lacks is left to update()."""
    log = MarkLog({"0": (0, 5), "1": (0, 7)})
    held = log.queues
    log.update(dict(held), ["0", "1"])
    v, held = log.version, log.queues
    log.raise_one("1", (0, 9))
    assert log.queues is held and held["1"] == (0, 9) and log.version == v + 1
    assert log.changes_since(v) == {"1": (0, 9)}
    log.raise_one("7", (0, 1))
    assert "7" not in log.queues and log.version == v + 1
