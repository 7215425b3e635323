"""One consumer over several shards (store/shards.py): each queue (or broadcast clientId) lives in
exactly one shard's keys, every record is delivered once, and whatever reads or writes a
consumer (acks from another node, views, resets, checkpoints and their restore, deletes, grants,
rate limits) sees all shards. Real scripts on fakeredis, the memory broker."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gateway.api.registry_wire import consumer_fields
from gateway.broker.memory import MemoryBroker
from gateway.core.errors import Conflict
from gateway.store import OffsetStore
from gateway.store.keys import KeyLayout
from gateway.store.shards import shard_name, shard_of

from .conftest import Gateway, build

pytestmark = pytest.mark.anyio

T = "orders"
G = "g1"
S = 3
QUEUES = [str(i) for i in range(8)]


def produce(broker: MemoryBroker, per_queue: int = 5) -> None:
    broker.create(T, len(QUEUES))
    for q in QUEUES:
        broker.append(T, q, *[f"{q}-{i}" for i in range(per_queue)])


async def register(gw: Gateway, consumer: str = G, **body: Any) -> Any:
    return await gw.registry.put_consumer(
        consumer, consumer_fields({"topics": [T], "shards": S, **body}, whole=True))


def node(gw: Gateway, broker: MemoryBroker, **settings: Any) -> Gateway:
    """Another gateway process on the same Redis: a store (and caches) of its own."""
    return build(OffsetStore(gw.store.redis, gw.store.prefix), broker, **settings)


async def drain(gw: Gateway, consumer: str = G, **kw: Any) -> Counter[str]:
    seen: Counter[str] = Counter()
    while True:
        got = await gw.fetch(consumer, max_messages=2, **kw)
        if got.batch is None:
            return seen
        seen.update(r.value.decode() for r in got.batch.records)
        assert (await gw.consume.ack(got.batch.request_id)).result == "committed"


async def hash_queues(store: OffsetStore, name: str, client_id: str = "") -> set[str]:
    raw = await store.redis.hgetall(store.queues_key(name, client_id))
    return {k.decode().split(":")[1] for k in raw if k.decode().count(":") == 2}


async def test_each_queue_lives_in_one_shard_and_every_record_comes_once(
        gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker)
    await register(gw)
    seen = await drain(gw)
    assert len(seen) == 40 and set(seen.values()) == {1}
    for k in range(S):
        assert await hash_queues(gw.store, shard_name(G, k, S)) == \
            {q for q in QUEUES if shard_of(q, S) == k}
    assert {q.queue: q.committed for q in await gw.store.queue_states(G)} == dict.fromkeys(QUEUES, 5)
    [read] = await gw.store.read_consumers([G])
    assert sorted(q.queue for q in read.queues) == sorted(QUEUES)
    # the settings' copies: same registration, the rate limit split (none here)
    copy = await gw.store.redis.hgetall(gw.store.config_key(shard_name(G, 2, S)))
    assert copy[b"shards"] == b"3" and copy[b"topics"] == b",orders,"


async def test_another_node_with_a_stale_shard_count_routes_again(
        gw: Gateway, broker: MemoryBroker) -> None:
    """The shard count is cached per process: a node that read it before it changed is told by
    choose.lua (fetch) or finds no lock where it looked (ack), and reads it again."""
    produce(broker)
    b, c = node(gw, broker), node(gw, broker)
    assert await b.store.shards.get(G) == 1 and await c.store.shards.get(G) == 1  # cached: 1
    await register(gw)
    got = await b.fetch(G, max_messages=2)  # choose.lua answers {7, 3}: b walks 3 shards
    assert got.batch is not None and await b.store.shards.get(G) == S
    k = shard_of(got.batch.queue, S)
    assert await hash_queues(gw.store, shard_name(G, k, S)) >= {got.batch.queue}
    if k:
        assert not await hash_queues(gw.store, G) & {got.batch.queue}
    assert (await c.consume.ack(got.batch.request_id)).result == "committed"  # c routes again
    assert await c.store.shards.get(G) == (S if k else 1)  # (shard 0 was right under either)
    seen = await drain(b)
    assert len(seen) == 38 and set(seen.values()) == {1}


async def test_the_shard_count_is_fixed_while_offsets_exist(gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker)
    await register(gw)
    got = await gw.fetch(G)
    assert got.batch is not None
    with pytest.raises(Conflict) as e:
        await register(gw, shards=1)
    assert e.value.code == "shards_fixed"
    with pytest.raises(Conflict):
        await gw.registry.patch_consumer(G, consumer_fields({"shards": 2}))
    await register(gw, maxBatch=5)  # the same count: any other change is fine
    out = await gw.registry.delete_consumer(G, delete_offsets=True)
    assert out.keys_deleted >= 2  # a queue hash and its indexes
    assert not [k async for k in gw.store.redis.scan_iter(match="mqgw:{g1*")]
    await register(gw, shards=2)  # no offsets any more: free to change
    assert await gw.store.has_offsets(G) is False


async def test_unregistering_without_the_offsets_keeps_their_shards(
        gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker)
    await register(gw)
    first = await drain(gw)
    assert len(first) == 40
    await gw.registry.delete_consumer(G, delete_offsets=False)
    broker.append(T, "5", "late")
    # open mode: the name still reads under its shards, from where it was (a long poll: the
    # node's watermark copy may be a few ms older than the record)
    got = await gw.fetch(G, wait_ms=10_000)
    assert got.batch is not None and [r.value for r in got.batch.records] == [b"late"]
    assert got.batch.queue == "5" and got.batch.offset == 5
    assert await gw.store.shards.read(G) == S


async def test_broadcast_client_ids_spread_over_shards(gw: Gateway, broker: MemoryBroker) -> None:
    produce(broker, 2)
    await register(gw, mode="broadcast")
    clients = [f"c{i}" for i in range(6)]
    for c in clients:
        seen = await drain(gw, client_id=c)
        assert len(seen) == 16 and set(seen.values()) == {1}, c
        assert await hash_queues(gw.store, shard_name(G, shard_of(c, S), S), c) == set(QUEUES)
    assert len({shard_of(c, S) for c in clients}) > 1  # the test spreads them
    assert sorted(c for c, _ in await gw.store.clients(G)) == clients
    for c in clients:  # the views find each clientId in its shard
        await gw.registry.require_seen(G, c)
    [read] = await gw.store.read_consumers([G])
    assert sorted(read.client_queues) == clients
    assert all(len(v) == 8 for v in read.client_queues.values())


async def test_reset_and_the_views_cover_every_shard(gw: Gateway, broker: MemoryBroker) -> None:
    from gateway.core.reset import ResetRequest, reset

    produce(broker)
    await register(gw)
    await drain(gw)
    done = await reset(gw.store, broker, G, ResetRequest(topic=T, to="earliest"),
                       await gw.store.registry.config(G), client_idle_ms=1000)
    assert done.moved == len(QUEUES)
    assert {q.queue: q.committed for q in await gw.store.queue_states(G)} == dict.fromkeys(QUEUES, 0)
    assert len(await drain(gw)) == 40


async def test_checkpoints_and_their_restore_cover_every_shard(
        make_gateway: Any, broker: MemoryBroker) -> None:
    gw: Gateway = make_gateway(checkpoint_interval_ms=1000)
    produce(broker)
    await register(gw)
    got = await gw.fetch(G, max_messages=5)
    assert got.batch is not None
    await gw.consume.ack(got.batch.request_id)
    assert await gw.checkpoints.round([G]) == 1
    assert broker.groups["mqgw." + G][(T, got.batch.queue)] == 5
    for k in range(S):  # Redis loses the consumer's offsets (its settings stay)
        await gw.store.redis.delete(gw.store.queues_key(shard_name(G, k, S)))
    seen = await drain(gw)
    assert len(seen) == 35 and not any(v.startswith(got.batch.queue + "-") for v in seen)
    for k in range(S):
        assert await hash_queues(gw.store, shard_name(G, k, S)) == \
            {q for q in QUEUES if shard_of(q, S) == k}


async def test_a_redis_that_lost_the_settings_gets_them_back_before_filing_queues(
        make_gateway: Any, broker: MemoryBroker) -> None:
    """After a loss, a node with the count cached is told "1" by an empty Redis: it asks for the
    registry's copy first (here: written back by hand, as registry_copy does), and files every
    queue in its shard."""
    gw: Gateway = make_gateway(checkpoint_interval_ms=1000)
    produce(broker)
    await register(gw)
    assert len(await drain(gw)) == 40
    cfg = await gw.store.registry.config(G)
    await gw.store.redis.flushall()
    broker.append(T, "1", "late")
    restored: list[bool] = []

    async def lost() -> bool:
        restored.append(True)
        await gw.store.registry.replace_config(G, cfg)
        return True

    got = await gw.store.choose(G, "", T, await broker.watermarks(T),
                                address="a", default_timeout_ms=1000, default_start="earliest",
                                client_idle_ms=1000, settings_lost=lost)
    assert restored and await gw.store.shards.get(G) == S
    assert type(got).__name__ in ("Lock", "NoQueue")
    for k in range(S):
        assert await hash_queues(gw.store, shard_name(G, k, S)) <= \
            {q for q in QUEUES if shard_of(q, S) == k}


async def test_grants_and_rate_limits_reach_every_shard(make_gateway: Any, broker: MemoryBroker) -> None:
    gw: Gateway = make_gateway()
    produce(broker)
    await register(gw, rateLimit={"messagesPerSecond": 300, "burst": 30})
    for k in range(1, S):
        copy = await gw.store.redis.hgetall(gw.store.config_key(shard_name(G, k, S)))
        assert (copy[b"rate"], copy[b"burst"]) == (b"100", b"10")
    await gw.store.registry.grant("k1", "ab" * 32, [G])
    for k in range(S):
        assert await gw.store.redis.hget(gw.store.grants_key(shard_name(G, k, S)), "k1") == b"ab" * 32
    await gw.store.registry.revoke_grants("k1", [G])
    for k in range(S):
        assert not await gw.store.redis.exists(gw.store.grants_key(shard_name(G, k, S)))


def test_a_shard_key_reads_as_its_consumer() -> None:
    layout = KeyLayout("mqgw")
    assert layout.parse_queue_key("mqgw:{g1#2}:q") == ("g1", "")
    assert layout.parse_queue_key("mqgw:{g1#2.17}:q") == ("g1", "")
    assert layout.parse_queue_key("mqgw:{g1#2}:q:c9") == ("g1", "c9")
    assert layout.parse_queue_key("mqgw:{g1}:q") == ("g1", "")


@pytest.mark.parametrize("shards", [2, 3, 5, 16])
def test_shards_land_in_equal_slot_ranges_one_each(shards: int) -> None:
    """On a cluster whose primaries hold equal slot ranges, a consumer's shards sit on as many
    primaries as they can (shards.shard_name)."""
    from redis.crc import key_slot

    for g in ("g1", "orders-service", "x"):
        bands = [int(key_slot(shard_name(g, k, shards).encode()) // (16_384 / shards))
                 for k in range(shards)]
        assert sorted(bands) == list(range(shards)), (g, bands)


def test_a_topics_queues_spread_evenly() -> None:
    """Numbered queues go round robin (a crc32 of each id put none of 6 partitions in shard 0 of
    3); other ids, clientIds among them, by crc32."""
    from collections import Counter

    assert Counter(shard_of(str(p), 3) for p in range(6)) == {0: 2, 1: 2, 2: 2}
    assert Counter(shard_of(f"broker-a.{q}", 3) for q in range(6)) == {0: 2, 1: 2, 2: 2}
    assert Counter(shard_of(str(p), 4) for p in range(1024)) == dict.fromkeys(range(4), 256)
    assert shard_of("host-a.4711", 1) == 0 and 0 <= shard_of("client-x", 3) < 3
