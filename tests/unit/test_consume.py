"""The consume service (core/consume.py, core/fetch.py) over the memory broker and fakeredis:
what /message, /ack and /unlock decide, as typed results and domain errors, with no HTTP."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from gateway.broker import BrokerUnavailable, FetchResult, Record, Skipped, SkipReason, UnknownTopic
from gateway.broker.memory import MemoryBroker
from gateway.core.errors import Invalid

from .conftest import Clock, Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "c1"


def values(got: Any) -> list[str]:
    assert got.batch is not None, got
    return [r.value.decode() for r in got.batch.records]


def produce(broker: MemoryBroker, queues: int, *vals: str, queue: str = "0") -> None:
    broker.create(T, queues)
    broker.append(T, queue, *vals)


async def test_every_record_once_without_faults(gw: Gateway, broker: MemoryBroker) -> None:
    broker.create(T, 3)
    for q in "012":
        broker.append(T, q, *[f"{q}-{i}" for i in range(7)])
    seen: Counter[str] = Counter()
    while True:
        got = await gw.fetch(C, max_messages=4)
        if got.batch is None:
            assert got.status == "empty"
            break
        assert not got.batch.redelivered
        seen.update(values(got))
        assert (await gw.consume.ack(got.batch.request_id)).result == "committed"
    assert len(seen) == 21 and set(seen.values()) == {1}
    assert {q.queue: q.committed for q in await gw.store.queue_states(C)} == {"0": 7, "1": 7, "2": 7}


async def test_a_locked_queue_is_not_handed_out_twice(make_gateway: Any, broker: MemoryBroker) -> None:
    produce(broker, 1, "x1", "x2")
    a, b = make_gateway(), make_gateway()  # two nodes on one Redis
    first = await a.fetch(C)
    assert values(first) == ["x1", "x2"]
    assert (await b.fetch(C)).status == "empty"


async def test_stale_ack_after_expiry_and_retake_is_rejected(
        make_gateway: Any, broker: MemoryBroker, clock: Clock) -> None:
    produce(broker, 1, "x1", "x2", "x3")
    n0, n1 = make_gateway(consume_timeout_ms=60_000), make_gateway(consume_timeout_ms=60_000)
    a = await n0.fetch(C)
    assert a.batch and not a.batch.redelivered and a.batch.offset == 0
    assert (await n1.fetch(C)).status == "empty"
    clock.advance(60_000)  # the lock expires
    b = await n1.fetch(C)
    assert b.batch and b.batch.redelivered and b.batch.offset == 0 and values(b) == ["x1", "x2", "x3"]
    stale = await n0.consume.ack(a.batch.request_id)
    assert stale.result == "lock_lost"  # answered 409 by the HTTP layer
    ok = await n0.consume.ack(b.batch.request_id)
    assert (ok.result, ok.committed) == ("committed", 3)
    assert (await n1.consume.ack(b.batch.request_id)).result == "already_committed"
    assert (await n1.consume.ack(a.batch.request_id)).result == "already_committed"


async def test_a_shorter_timeout_applies_to_a_held_lock(gw: Gateway, broker: MemoryBroker,
                                                         clock: Clock) -> None:
    """Expiry uses the lock's time and the consumer's current timeout."""
    produce(broker, 1, "x1")
    await gw.store.set_config(C, {"consume_timeout_ms": 60_000})
    assert (await gw.fetch(C)).batch is not None
    clock.advance(300)
    assert (await gw.fetch(C)).status == "empty"
    await gw.registry.patch_consumer(C, {"consume_timeout_ms": "200"})
    again = await gw.fetch(C)
    assert again.batch and again.batch.redelivered and again.batch.lock_timeout_ms == 200


async def test_late_ack_commits_when_nobody_took_the_lock(gw: Gateway, broker: MemoryBroker,
                                                          clock: Clock) -> None:
    produce(broker, 1, "y1", "y2")
    a = await gw.fetch(C)
    assert a.batch is not None
    clock.advance(5_000)  # well past the 1 s consume timeout
    r = await gw.consume.ack(a.batch.request_id)
    assert (r.result, r.lock_state, r.committed) == ("committed", "expired", 2)
    assert (await gw.fetch(C)).status == "empty"


async def test_unlock_redelivers_at_once_and_piggyback_ack(gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker, 1, "z1", "z2")
    a = await gw.fetch(C, max_messages=1)
    assert a.batch and values(a) == ["z1"]
    assert (await gw.consume.unlock(a.batch.request_id)).result == "unlocked"
    b = await gw.fetch(C, max_messages=1)
    # handed out before: flagged (before issue 33 it came back unflagged)
    assert b.batch and values(b) == ["z1"] and b.batch.redelivered
    assert (await gw.consume.unlock(a.batch.request_id)).result == "lock_lost"  # a's token is gone
    c = await gw.fetch(C, max_messages=5, ack_request_id=b.batch.request_id)
    assert c.ack is not None and c.ack.result == "committed"
    assert c.batch and values(c) == ["z2"] and c.batch.offset == 1
    # a requestId of another consumer is refused rather than silently acked elsewhere
    with pytest.raises(Invalid) as e:
        await gw.fetch("other", ack_request_id=c.batch.request_id)
    assert e.value.code == "request_id_mismatch"


async def test_an_ack_names_the_broker_its_batch_came_from(store: Any) -> None:
    from .conftest import build

    one, two = MemoryBroker("one"), MemoryBroker("two")
    for b in (one, two):
        b.create(T, 1)
        b.append(T, "0", "v")
    got = await build(store, one).fetch(C)
    assert got.batch is not None
    with pytest.raises(Invalid) as e:
        await build(store, two).consume.ack(got.batch.request_id)
    assert e.value.code == "invalid_request_id" and "'one'" in str(e.value)


async def test_broadcast_each_client_sees_everything_once(gw: Gateway, broker: MemoryBroker) -> None:
    broker.create(T, 2)
    broker.append(T, "0", *[f"a{i}" for i in range(5)])
    broker.append(T, "1", *[f"b{i}" for i in range(5)])
    for client in ("client-a", "client-b"):
        seen: Counter[str] = Counter()
        while (got := await gw.fetch(C, client_id=client, max_messages=3)).batch is not None:
            seen.update(values(got))
            assert (await gw.consume.ack(got.batch.request_id)).result == "committed"
        assert len(seen) == 10 and set(seen.values()) == {1}, client
    assert sorted(c for c, _ in await gw.store.clients(C)) == ["client-a", "client-b"]
    assert await gw.store.queue_states(C) == []  # cluster-mode offsets never touched


async def test_paused_and_rate_limited_are_answered_at_once(gw: Gateway, broker: MemoryBroker,
                                                            clock: Clock) -> None:
    clock.freeze()
    produce(broker, 1, *[f"v{i}" for i in range(10)])
    await gw.registry.set_paused(C, True)
    assert (await gw.fetch(C, wait_ms=5_000)).status == "paused"  # never long-polled
    await gw.registry.set_paused(C, False)
    await gw.registry.patch_consumer(C, {"rate": "1", "burst": "3"})
    got = await gw.fetch(C)
    assert got.batch and values(got) == ["v0", "v1", "v2"]  # the burst
    assert (await gw.consume.ack(got.batch.request_id)).result == "committed"
    limited = await gw.fetch(C, wait_ms=5_000)
    assert limited.status == "rate_limited" and limited.retry_after_ms == 1000


async def test_unknown_topic_raises(gw: Gateway) -> None:
    with pytest.raises(UnknownTopic):  # the HTTP layer answers 404 unknown_topic
        await gw.fetch(C)


async def test_committed_offset_below_retention_moves_to_earliest(gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker, 1, *[f"v{i}" for i in range(20)])
    first = await gw.fetch(C, max_messages=2)
    assert first.batch and values(first) == ["v0", "v1"]
    assert (await gw.consume.ack(first.batch.request_id)).result == "committed"
    broker.delete_before(T, "0", 15)  # retention removed offsets 0..14
    second = await gw.fetch(C, max_messages=3)
    assert second.batch and second.batch.skipped == Skipped(2, 15, SkipReason.OUT_OF_RETENTION)
    assert second.batch.offset == 2 and values(second) == ["v15", "v16", "v17"]
    assert second.batch.next_offset == 18
    assert (await gw.consume.ack(second.batch.request_id)).committed == 18


async def test_retention_gap_with_nothing_left_is_committed_by_the_gateway(
        gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker, 1, *[f"v{i}" for i in range(10)])
    got = await gw.fetch(C, max_messages=1)
    assert got.batch is not None
    await gw.consume.unlock(got.batch.request_id)
    broker.delete_before(T, "0", 10)  # everything expired, log empty at 10
    assert (await gw.fetch(C)).status == "empty"
    assert (await gw.store.queue_states(C))[0].committed == 10
    broker.append(T, "0", "after")
    assert values(await gw.fetch(C, wait_ms=2_000)) == ["after"]


async def test_holes_of_a_broker_are_skipped_and_reported(gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker, 1, *[f"v{i}" for i in range(6)])
    r = await gw.fetch(C)
    assert r.batch and values(r) == [f"v{i}" for i in range(6)] and r.batch.skipped is None
    await gw.consume.ack(r.batch.request_id)
    broker.append(T, "0", "a", "b", "c", "d", "e")  # offsets 6..10
    broker.remove(T, "0", 6, 7, 9)
    r = await gw.fetch(C, wait_ms=2_000)
    assert r.batch and r.batch.skipped == Skipped(6, 8, SkipReason.GAP) and values(r) == ["c", "e"]
    assert (r.batch.offset, r.batch.next_offset) == (6, 11)
    assert (await gw.consume.ack(r.batch.request_id)).committed == 11


async def test_new_queues_are_picked_up(gw: Gateway, broker: MemoryBroker) -> None:
    broker.create(T, 2)
    assert (await gw.fetch(C)).status == "empty"
    broker.create(T, 4)
    broker.append(T, "3", "new-partition")
    r = await gw.fetch(C, wait_ms=2_000)
    assert r.batch and r.batch.queue == "3" and values(r) == ["new-partition"]
    assert [q.queue for q in await gw.store.queue_states(C)] == ["0", "1", "2", "3"]


async def test_watermarks_are_listed_once_per_interval_for_many_requests(
        make_gateway: Any, broker: MemoryBroker) -> None:
    produce(broker, 3, "x", queue="1")
    gw = make_gateway(metadata_refresh_ms=10_000)
    await asyncio.gather(*(gw.fetch(f"c{i}") for i in range(50)))
    assert broker.watermark_calls == 1


async def test_a_failed_read_gives_back_its_lock_and_its_rate_limit_tokens(
        gw: Gateway, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """choose.lua charges the bucket before the read; a broker failure must keep neither the
    charge (a blip would turn into 429s) nor the lock (the queue would wait for its timeout)."""
    produce(broker, 1, *[f"v{i}" for i in range(20)])
    await gw.store.set_config(C, {"rate": "1.0", "burst": "10"})

    async def failing_fetch(*a: Any) -> Any:
        raise BrokerUnavailable("broker down")

    with monkeypatch.context() as m:
        m.setattr(broker, "fetch", failing_fetch)
        for _ in range(3):  # each would charge 10 tokens of a bucket of 10
            with pytest.raises(BrokerUnavailable):
                await gw.fetch(C)
    tokens = float(await gw.store.redis.hget(gw.store.bucket_key(C), "tokens") or 0)
    assert tokens >= 9.9  # all given back (plus what refilled meanwhile, capped at burst)
    got = await gw.fetch(C)  # not rate limited, and not locked out
    assert got.status == "ok" and values(got) == [f"v{i}" for i in range(10)]


async def test_a_redelivery_stays_one_when_its_first_read_comes_back_empty(
        gw: Gateway, broker: MemoryBroker, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that says nothing (a slow broker) frees the queue for a re-check; when the same
    poll takes it again, the batch is still the expired holder's records: redelivered."""
    produce(broker, 1, "a", "b")
    real_fetch = broker.fetch
    silent = [0]

    async def flaky_fetch(*a: Any) -> Any:
        if silent[0]:
            silent[0] -= 1
            return FetchResult([], a[2])  # no records, nothing said about the log
        return await real_fetch(*a)

    first = await gw.fetch(C)
    assert first.batch and values(first) == ["a", "b"] and not first.batch.redelivered
    clock.advance(2_000)  # its lock expires, never acked
    monkeypatch.setattr(broker, "fetch", flaky_fetch)
    silent[0] = 1
    again = await gw.fetch(C, wait_ms=3_000)
    assert again.batch and values(again) == ["a", "b"] and again.batch.redelivered


async def test_records_keep_key_headers_and_bytes(gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker, 1, "text")
    broker.logs[T]["0"][1] = Record(1, b"\xff", b"\xfe\x00", [("h", b"\x80")], 5)
    broker.end[(T, "0")] = 2
    got = await gw.fetch(C)
    assert got.batch is not None
    raw = got.batch.records[1]
    assert (raw.key, raw.value, raw.headers, raw.timestamp) == (b"\xff", b"\xfe\x00", [("h", b"\x80")], 5)


async def test_max_bytes_ends_a_batch_and_its_ack_commits_up_to_there(
        gw: Gateway, broker: MemoryBroker, clock: Clock) -> None:
    """``max_bytes`` counts key, value and headers; the batch ends before the record that would
    pass it, the ack commits only what was returned, and the rest comes next. The first record
    comes whatever its size (a larger record must not stall its queue), and the rate-limit
    tokens of records not returned are given back."""
    clock.freeze()
    produce(broker, 1, "aaaa", "bbbb", "cccc", "d" * 50, "eeee")
    await gw.store.set_config(C, {"rate": "1.0", "burst": "10"})
    got = await gw.fetch(C, max_bytes=9)  # 4 + 4 fit, the third would make 12
    assert got.batch and values(got) == ["aaaa", "bbbb"] and got.batch.next_offset == 2
    assert (await gw.consume.ack(got.batch.request_id)).committed == 2
    tokens = float(await gw.store.redis.hget(gw.store.bucket_key(C), "tokens") or 0)
    assert tokens == pytest.approx(8.0)  # 5 charged (the backlog), 3 given back
    got = await gw.fetch(C, max_bytes=4)
    assert got.batch and values(got) == ["cccc"]
    await gw.consume.ack(got.batch.request_id)
    got = await gw.fetch(C, max_bytes=4)  # larger than the limit, and first: returned all the same
    assert got.batch and values(got) == ["d" * 50] and got.batch.next_offset == 4
    await gw.consume.ack(got.batch.request_id)
    got = await gw.fetch(C, max_bytes=1_000_000)
    assert got.batch and values(got) == ["eeee"] and got.batch.next_offset == 5


async def test_max_bytes_counts_keys_and_headers(gw: Gateway, broker: MemoryBroker) -> None:
    broker.create(T, 1)
    broker.logs[T]["0"][0] = Record(0, b"kk", b"vv", [("h", b"123")], 0)  # 2 + 2 + 1 + 3 = 8
    broker.logs[T]["0"][1] = Record(1, None, b"x", [], 0)
    broker.end[(T, "0")] = 2
    got = await gw.fetch(C, max_bytes=8)
    assert got.batch and [r.offset for r in got.batch.records] == [0]
    await gw.consume.unlock(got.batch.request_id)
    got = await gw.fetch(C, max_bytes=9)
    assert got.batch and [r.offset for r in got.batch.records] == [0, 1]


async def test_extend_holds_the_queue_for_another_timeout(
        make_gateway: Any, broker: MemoryBroker, clock: Clock) -> None:
    """extend.lua: the lock starts again now, so no other node takes the queue while a long
    handler works; the ack then commits as usual."""
    produce(broker, 1, "x1", "x2")
    n0, n1 = make_gateway(consume_timeout_ms=10_000), make_gateway(consume_timeout_ms=10_000)
    a = await n0.fetch(C)
    assert a.batch is not None
    for _ in range(3):  # 3 x 8 s: far past the 10 s timeout in all
        clock.advance(8_000)
        r = await n1.consume.extend(a.batch.request_id)  # any node: the requestId says it all
        assert (r.result, r.committed, r.timeout_ms) == ("extended", 0, 10_000)
        assert (await n1.fetch(C)).status == "empty"  # still held
    assert (await n0.consume.ack(a.batch.request_id)).lock_state == "held"
    r = await n0.consume.extend(a.batch.request_id)
    assert (r.result, r.committed, r.timeout_ms) == ("already_committed", 2, 0)


async def test_extend_is_refused_once_the_lock_is_lost_or_handed_back(
        gw: Gateway, broker: MemoryBroker, clock: Clock) -> None:
    produce(broker, 1, "y1")
    a = await gw.fetch(C)
    assert a.batch is not None
    clock.advance(5_000)  # past the 1 s timeout, but nobody took the queue: held again
    assert (await gw.consume.extend(a.batch.request_id)).result == "extended"
    assert (await gw.fetch(C)).status == "empty"
    clock.advance(5_000)
    b = await gw.fetch(C)  # expired, and taken this time
    assert b.batch and b.batch.redelivered
    assert (await gw.consume.extend(a.batch.request_id)).result == "lock_lost"
    assert (await gw.consume.unlock(b.batch.request_id)).result == "unlocked"
    assert (await gw.consume.extend(b.batch.request_id)).result == "not_locked"
    c = await gw.fetch(C)  # handed back: redelivered at once, not held by the extend
    assert c.batch and values(c) == ["y1"]
    await gw.store.reset(C, "", T, {"0": 1})  # an operator moves the queue past the batch
    r = await gw.consume.extend(c.batch.request_id)
    assert (r.result, r.committed) == ("offset_reset", 1)
    gone = await gw.store.reset(C, "", T, {"0": 0}) and await gw.store.redis.delete(
        gw.store.queues_key(C, ""))
    assert gone and (await gw.consume.extend(c.batch.request_id)).result == "unknown"


async def test_one_fetch_over_several_topics_answers_from_the_one_with_records(
        gw: Gateway, broker: MemoryBroker) -> None:
    broker.create("a", 1)
    broker.create("b", 2)
    broker.append("b", "1", "in-b")
    got = await gw.fetch(C, topic="a", also_topics=("b",))
    assert got.topic == "b" and values(got) == ["in-b"]
    assert (await gw.consume.ack(got.batch.request_id)).result == "committed"  # type: ignore[union-attr]
    assert (await gw.fetch(C, topic="a", also_topics=("b",))).status == "empty"
    broker.append("a", "0", "in-a")  # the piggy-backed ack of a batch of either topic is taken
    got = await gw.fetch(C, topic="b", also_topics=("a",), wait_ms=2_000)
    assert got.topic == "a" and values(got) == ["in-a"]
    nxt = await gw.fetch(C, topic="b", also_topics=("a",), ack_request_id=got.batch.request_id)  # type: ignore[union-attr]
    assert nxt.ack is not None and nxt.ack.result == "committed" and nxt.status == "empty"


async def test_a_long_poll_over_several_topics_wakes_for_any_of_them(
        gw: Gateway, broker: MemoryBroker) -> None:
    broker.create("a", 1)
    broker.create("b", 1)
    poll = asyncio.ensure_future(gw.fetch(C, topic="a", also_topics=("b",), wait_ms=5_000))
    await asyncio.sleep(0.05)
    assert not poll.done()
    broker.append("b", "0", "late")
    got = await asyncio.wait_for(poll, 5)
    assert got.topic == "b" and values(got) == ["late"]


async def test_every_batch_handed_out_again_is_flagged_whoever_released_its_lock(
        gw: Gateway, broker: MemoryBroker, clock: Clock) -> None:
    """Issue 33: a batch handed back with /unlock came back unflagged (unlock.lua set lock=0
    and choose.lua flagged only a takeover of a lock that was set), and so did a batch whose
    lock expired, nobody took it, and a late /unlock then freed it. Each queue now remembers how
    far it was handed out (rdl), and every batch starting below it is flagged."""
    produce(broker, 1, *[f"v{i}" for i in range(5)])
    first = await gw.fetch(C)
    assert first.batch and values(first) == [f"v{i}" for i in range(5)] and not first.batch.redelivered
    assert (await gw.consume.unlock(first.batch.request_id)).result == "unlocked"
    again = await gw.fetch(C)
    assert again.batch and values(again) == values(first) and again.batch.redelivered
    # the lock runs out, nobody takes the queue, a late /unlock frees it: still flagged
    clock.advance(2_000)
    assert (await gw.consume.unlock(again.batch.request_id)).result == "unlocked"
    third = await gw.fetch(C)
    assert third.batch and values(third) == values(first) and third.batch.redelivered
    # a shorter batch after the unlock, acked: the rest of what was handed out is still flagged
    assert (await gw.consume.unlock(third.batch.request_id)).result == "unlocked"
    short = await gw.fetch(C, max_messages=2)
    assert short.batch and values(short) == ["v0", "v1"] and short.batch.redelivered
    assert (await gw.consume.ack(short.batch.request_id)).result == "committed"
    rest = await gw.fetch(C, max_messages=2)
    assert rest.batch and values(rest) == ["v2", "v3"] and rest.batch.redelivered
    assert (await gw.consume.ack(rest.batch.request_id)).result == "committed"
    last = await gw.fetch(C)
    assert last.batch and values(last) == ["v4"] and last.batch.redelivered
    assert (await gw.consume.ack(last.batch.request_id)).result == "committed"
    # past everything handed out: new records come unflagged
    produce(broker, 1, "n0")
    new = await gw.fetch(C, wait_ms=3_000)  # (the watermark copy catches up)
    assert new.batch and values(new) == ["n0"] and not new.batch.redelivered


async def test_a_takeover_whose_read_fails_leaves_the_next_batch_flagged(
        gw: Gateway, broker: MemoryBroker, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: the fetch that took over an expired lock gave it back when its read failed
    (core/fetch.py), and the knowledge of the takeover lived only in that request: the next
    fetch, on any node, handed the expired batch out again unflagged (32-192 records per
    20,000 under load, "always the last batch on a partition, 3-5 s later")."""
    produce(broker, 1, "a", "b", "c")
    first = await gw.fetch(C, max_messages=2)
    assert first.batch and values(first) == ["a", "b"] and not first.batch.redelivered
    clock.advance(2_000)  # its lock expires, never acked

    async def failing_fetch(*a: Any) -> Any:
        raise BrokerUnavailable("broker down")

    with monkeypatch.context() as m:
        m.setattr(broker, "fetch", failing_fetch)
        with pytest.raises(BrokerUnavailable):
            await gw.fetch(C)  # takes the expired lock over, reads nothing, gives it back
    again = await gw.fetch(C, max_messages=1)  # a fresh request: nothing remembered on the node
    assert again.batch and values(again) == ["a"] and again.batch.redelivered
    assert (await gw.consume.ack(again.batch.request_id)).result == "committed"
    rest = await gw.fetch(C, max_messages=1)  # "b" was in the expired batch too
    assert rest.batch and values(rest) == ["b"] and rest.batch.redelivered


async def test_a_takeover_smaller_than_an_expired_batch_with_markers_flags_all_of_it(
        gw: Gateway, broker: MemoryBroker, clock: Clock) -> None:
    """Issue 33: an expired lock's batch was bounded by its start plus the records it was
    allowed, one offset a record. In a topic written in transactions (the relay's exactly-once
    hops write into users' topics) a commit marker follows each transaction: 3 records spanned
    offsets 0-4 here, and after a takeover with max=1 the record at offset 4 came again
    unflagged. The batch now says how far it really went when its span exceeds the bound."""
    produce(broker, 1, *[f"v{i}" for i in range(5)])
    broker.remove(T, "0", 1, 3)  # markers at 1 and 3: records at 0, 2, 4
    first = await gw.fetch(C, max_messages=3)
    assert first.batch and values(first) == ["v0", "v2", "v4"] and first.batch.next_offset == 5
    clock.advance(2_000)  # its lock expires, never acked
    for want in ("v0", "v2", "v4"):
        again = await gw.fetch(C, max_messages=1)
        assert again.batch and values(again) == [want] and again.batch.redelivered, want
        assert (await gw.consume.ack(again.batch.request_id)).result == "committed"
    broker.append(T, "0", "n5")
    new = await gw.fetch(C, max_messages=1, wait_ms=3_000)  # past everything handed out
    assert new.batch and values(new) == ["n5"] and not new.batch.redelivered


async def test_a_late_report_of_a_batch_end_raises_the_mark_itself(
        gw: Gateway, broker: MemoryBroker, clock: Clock) -> None:
    """handed.lua: a report that comes after another fetch took the queue (a later token)
    raises the handed-out mark, into which the takeover had already folded the old bound."""
    produce(broker, 1, *[f"v{i}" for i in range(9)])
    wm = {"0": (0, 9)}
    kw: dict[str, Any] = dict(address="unit", default_timeout_ms=1_000, default_start="earliest",
                              client_idle_ms=60_000, max_messages=3)
    old = await gw.store.choose(C, "", T, wm, **kw)
    clock.advance(2_000)
    new = await gw.store.choose(C, "", T, wm, **kw)
    assert new.redeliver_below == 3  # type: ignore[union-attr]  # the old bound, folded in
    await gw.store.handed_out(C, "", T, "0", old.token, 6)  # type: ignore[union-attr]
    field = f"{T}:0:"
    got = await gw.store.redis.hmget(gw.store.queues_key(C, ""), field + "rdl", field + "out")
    assert [int(x) for x in got] == [6, 3]  # the mark rose; the new lock's bound is its own
    await gw.store.handed_out(C, "", T, "0", new.token, 7)  # type: ignore[union-attr]
    got = await gw.store.redis.hmget(gw.store.queues_key(C, ""), field + "rdl", field + "out")
    assert [int(x) for x in got] == [6, 7]


async def test_a_read_that_handed_nothing_out_raises_no_flag(
        gw: Gateway, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the mark: a lock whose read failed (or a batch read for a poll that
    answered from elsewhere) handed nothing out, so what follows is not flagged."""
    produce(broker, 1, "a")

    async def failing_fetch(*a: Any) -> Any:
        raise BrokerUnavailable("broker down")

    with monkeypatch.context() as m:
        m.setattr(broker, "fetch", failing_fetch)
        with pytest.raises(BrokerUnavailable):
            await gw.fetch(C)
    got = await gw.fetch(C)
    assert got.batch and values(got) == ["a"] and not got.batch.redelivered


async def test_batches_locked_at_once_on_several_topics_are_handed_back_but_one(
        make_gateway: Any, broker: MemoryBroker) -> None:
    """Both long polls find records in the same instant: one batch is answered, the other
    queue is unlocked at once (another fetch takes it without waiting for a lock timeout: a
    lock left behind would hold it for a minute, past the second fetch's wait)."""
    gw = make_gateway(consume_timeout_ms=60_000)
    broker.create("a", 1)
    broker.create("b", 1)
    poll = asyncio.ensure_future(gw.fetch(C, topic="a", also_topics=("b",), wait_ms=5_000))
    await asyncio.sleep(0.05)
    broker.append("a", "0", "x")
    broker.append("b", "0", "y")
    first = await asyncio.wait_for(poll, 5)
    assert first.batch is not None
    other = "b" if first.topic == "a" else "a"
    # A long poll: the other topic's watermark copy may not have seen its record yet (it is
    # refreshed every metadata_refresh_ms; the first answer came from the other topic's copy).
    second = await gw.fetch(C, topic=other, wait_ms=5_000)
    # handed back unanswered: nothing of it reached a client, so it is not a redelivery
    assert second.batch is not None and second.topic == other and not second.batch.redelivered


async def test_a_poll_choosing_when_another_topic_answers_is_not_cut_mid_choose(
        make_gateway: Any, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other topic's poll is inside choose (its script has locked the queue, its reply not
    yet read) when the first batch is answered: it is not cancelled there, which would leave
    the queue locked for the whole lock timeout; it finishes, and its batch is handed back."""
    gw = make_gateway(consume_timeout_ms=60_000)
    broker.create("a", 1)
    broker.create("b", 1)
    choose = gw.store.choose
    in_choose = asyncio.Event()

    async def slow_on_a(consumer: str, client_id: str, topic: str, *args: Any, **kw: Any) -> Any:
        got = await choose(consumer, client_id, topic, *args, **kw)
        if topic == "a" and in_choose.is_set():  # the long poll's choose, not the first look
            await asyncio.sleep(0.3)  # the script ran; its reply is still on its way
        return got

    monkeypatch.setattr(gw.store, "choose", slow_on_a)
    poll = asyncio.ensure_future(gw.fetch(C, topic="a", also_topics=("b",), wait_ms=5_000))
    await asyncio.sleep(0.05)  # both long polls wait
    in_choose.set()
    broker.append("a", "0", "x")
    broker.append("b", "0", "y")
    first = await asyncio.wait_for(poll, 5)
    assert first.batch is not None and first.topic == "b"
    second = await gw.fetch(C, topic="a", wait_ms=2_000)
    assert second.batch is not None and second.topic == "a"


async def test_an_unknown_topic_among_several_is_refused(gw: Gateway, broker: MemoryBroker) -> None:
    broker.create("a", 1)
    with pytest.raises(UnknownTopic):
        await gw.fetch(C, topic="a", also_topics=("nope",))
