"""Consume-path rules that need broker behaviour Tansu lacks; Redis is the real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.broker import Record, Skipped, SkipReason, UnknownTopic
from gateway.broker.kafka.adapter import read_checked
from gateway.broker.kafka.fetch import RawRead
from gateway.broker.memory import MemoryBroker

from .helpers import Wire, fetch_params, run_service, unique, values

T = "orders"


params = fetch_params


def test_committed_offset_below_retention_moves_to_earliest(redis_url: str) -> None:
    b = MemoryBroker()
    b.create(T, 1)
    b.append(T, "0", *[f"v{i}" for i in range(20)])
    g = unique()

    async def body(svc: Wire) -> None:
        first = await svc.fetch(params(g, max_messages=2))
        assert values(first) == ["v0", "v1"]
        assert (await svc.ack(first["requestId"])).result == "committed"
        b.delete_before(T, "0", 15)  # retention removed offsets 0..14
        second = await svc.fetch(params(g, max_messages=3))
        assert second["skipped"] == {"from": 2, "to": 15, "reason": "out_of_retention"}
        assert second["offset"] == 2 and values(second) == ["v15", "v16", "v17"]
        assert second["nextOffset"] == 18
        assert (await svc.ack(second["requestId"])).committed == 18
    run_service(redis_url, b, body)


def test_retention_gap_with_nothing_left_is_committed_by_the_gateway(redis_url: str) -> None:
    b = MemoryBroker()
    b.create(T, 1)
    b.append(T, "0", *[f"v{i}" for i in range(10)])
    g = unique()

    async def body(svc: Wire) -> None:
        await svc.fetch(params(g, max_messages=1))  # registers the consumer at offset 0
        b.delete_before(T, "0", 10)  # everything expired, log empty at 10
        states = await svc.store.queue_states(g)
        await svc.store.unlock(g, "", T, "0", states[0].token)
        r = await svc.fetch(params(g))
        assert r["status"] == "empty"
        assert (await svc.store.queue_states(g))[0].committed == 10
        b.append(T, "0", "after")
        # new records are seen at the next watermark refresh: a long poll waits for it
        assert values(await svc.fetch(params(g, wait_ms=2000))) == ["after"]
    run_service(redis_url, b, body)


def test_leading_gap_is_refetched_once_before_it_is_accepted() -> None:
    """The Kafka adapter's rule (a fetch racing a producer at the tail can skip records that
    become readable a moment later): a hole at the start is accepted only after a re-read."""
    log = {o: Record(o, None, f"v{o}".encode(), [], 0) for o in range(6)}
    reads: list[int] = []
    hide = [3]

    async def raw(at: int) -> RawRead:  # the read as librdkafka returns it
        reads.append(at)
        recs = [log[o] for o in sorted(log) if o >= at][:10]
        hidden, hide[0] = hide[0], 0
        hi = max(log) + 1
        return RawRead(recs[hidden:], hi, end_offset=hi if not recs[hidden:] else -1)

    async def body() -> None:
        r = await read_checked(raw, 0, 0.005)  # the first read hides 3 records: a tail race
        assert [x.offset for x in r.records] == [0, 1, 2, 3, 4, 5] and r.skipped is None
        assert reads == [0, 0] and r.next_offset == 6
        # a real hole (compaction): accepted after one re-check and reported
        log.update({o: Record(o, None, v, [], 0) for o, v in ((6, b"a"), (7, b"b"), (8, b"c"))})
        del log[6], log[7]
        reads.clear()
        r = await read_checked(raw, 6, 0.005)
        assert r.skipped == Skipped(6, 8, SkipReason.GAP) and [x.value for x in r.records] == [b"c"]
        assert reads == [6, 6] and r.next_offset == 9
        # a trusted broker (Apache Kafka, gap_recheck_ms 0): the hole is final at the first read
        log.update({o: Record(o, None, b"x", [], 0) for o in (10, 12)})
        reads.clear()
        r = await read_checked(raw, 9, 0)
        assert r.skipped == Skipped(9, 10, SkipReason.GAP) and [x.offset for x in r.records] == [10, 12]
        assert reads == [9] and r.next_offset == 13
    asyncio.run(body())


def test_holes_of_a_broker_are_skipped_and_reported(redis_url: str) -> None:
    """Offsets with no record (compaction) are the broker's business: the core commits past them
    with what the fetch says, never assuming contiguous offsets."""
    b = MemoryBroker()
    b.create(T, 1)
    b.append(T, "0", *[f"v{i}" for i in range(6)])
    g = unique()

    async def body(svc: Wire) -> None:
        r = await svc.fetch(params(g))
        assert values(r) == [f"v{i}" for i in range(6)] and "skipped" not in r
        await svc.ack(r["requestId"])
        b.append(T, "0", "a", "b", "c", "d", "e")  # offsets 6..10
        b.remove(T, "0", 6, 7, 9)
        r = await svc.fetch(params(g, wait_ms=2000))
        assert r["skipped"] == {"from": 6, "to": 8, "reason": "gap"} and values(r) == ["c", "e"]
        assert r["offset"] == 6 and r["nextOffset"] == 11
        assert (await svc.ack(r["requestId"])).committed == 11
    run_service(redis_url, b, body)


def test_new_partitions_are_picked_up_without_restart(redis_url: str) -> None:
    b = MemoryBroker()
    b.create(T, 2)
    g = unique()

    async def body(svc: Wire) -> None:
        assert (await svc.fetch(params(g)))["status"] == "empty"
        b.create(T, 4)
        b.append(T, "3", "new-partition")
        r = await svc.fetch(params(g, wait_ms=2000))
        assert r["queue"] == "3" and values(r) == ["new-partition"]
        assert [q.queue for q in await svc.store.queue_states(g)] == ["0", "1", "2", "3"]
    run_service(redis_url, b, body)


def test_watermarks_are_listed_once_per_interval_for_many_requests(redis_url: str) -> None:
    b = MemoryBroker()
    b.create(T, 3)
    b.append(T, "1", "x")

    async def body(svc: Wire) -> None:
        await asyncio.gather(*(svc.fetch(params(unique())) for _ in range(50)))
        assert b.watermark_calls == 1
    run_service(redis_url, b, body, refresh_ms=10_000)


def test_unknown_topic_is_404(redis_url: str) -> None:
    b = MemoryBroker()

    async def body(svc: Wire) -> None:
        with pytest.raises(UnknownTopic):  # the HTTP layer answers 404 unknown_topic
            await svc.fetch(params(unique()))
    run_service(redis_url, b, body)


def test_non_utf8_records_come_back_as_base64(redis_url: str) -> None:
    b = MemoryBroker()
    b.create(T, 1)
    b.append(T, "0", "text")
    b.logs[T]["0"][1] = b.logs[T]["0"][0].__class__(1, b"\xff", b"\xfe\x00", [("h", b"\x80")], 5)
    g = unique()

    async def body(svc: Wire) -> None:
        r = await svc.fetch(params(g))
        assert r["messages"][0]["encoding"] == "utf8" and r["messages"][0]["value"] == "text"
        raw = r["messages"][1]
        assert raw["encoding"] == "base64" and raw["value"] == "/gA=" and raw["key"] == "/w=="
        assert raw["headers"] == [["h", "gA=="]]
    run_service(redis_url, b, body)


def test_a_failed_read_gives_back_its_lock_and_its_rate_limit_tokens(redis_url: str) -> None:
    """choose.lua charges the bucket before the read; a broker failure must not keep the charge
    (a blip would turn into 429s afterwards) nor the lock (the queue would wait for its timeout)."""
    from gateway.broker import BrokerUnavailable

    b = MemoryBroker()
    b.create(T, 1)
    b.append(T, "0", *[f"v{i}" for i in range(20)])
    g = unique()
    real_fetch = b.fetch

    async def failing_fetch(*a: Any) -> Any:
        raise BrokerUnavailable("broker down")

    async def body(svc: Wire) -> None:
        store = svc.store
        await store.set_config(g, {"rate": "1.0", "burst": "10"})
        b.fetch = failing_fetch  # type: ignore[method-assign]
        for _ in range(3):  # each would charge 10 tokens of a bucket of 10
            with pytest.raises(BrokerUnavailable):
                await svc.fetch(params(g, max_messages=10))
        tokens = float(await store.redis.hget(store.bucket_key(g), "tokens"))
        assert tokens >= 9.9  # all given back (plus what refilled meanwhile, capped at burst)
        b.fetch = real_fetch  # type: ignore[method-assign]
        got = await svc.fetch(params(g, max_messages=10))  # not 429, and not locked out
        assert got["status"] == "ok" and values(got) == [f"v{i}" for i in range(10)]
    run_service(redis_url, b, body)


def test_a_redelivery_stays_one_when_its_first_read_comes_back_empty(redis_url: str) -> None:
    """A read that says nothing (a slow broker) frees the queue for a re-check; when the same
    long poll takes it again, the batch is still the expired holder's records: redelivered."""
    from gateway.broker import FetchResult

    b = MemoryBroker()
    b.create(T, 1)
    b.append(T, "0", "a", "b")
    g = unique()
    real_fetch = b.fetch
    silent = [0]

    async def flaky_fetch(*a: Any) -> Any:
        if silent[0]:
            silent[0] -= 1
            return FetchResult([], a[2])  # no records, nothing said about the log
        return await real_fetch(*a)

    async def body(svc: Wire) -> None:
        await svc.store.set_config(g, {"consume_timeout_ms": "100"})
        first = await svc.fetch(params(g))
        assert values(first) == ["a", "b"] and first["redelivered"] is False
        await asyncio.sleep(0.15)  # its lock expires, never acked
        b.fetch = flaky_fetch  # type: ignore[method-assign]
        silent[0] = 1
        again = await svc.fetch(params(g, wait_ms=3000))
        assert values(again) == ["a", "b"] and again["redelivered"] is True
    run_service(redis_url, b, body)
