"""The checkpoint and restore rules (core/checkpoint.py, restore.lua, choose.lua's restore answer)
one by one, over the broker double; Redis is the real redis-server. End to end, on both real
brokers: test_checkpoint.py."""

from __future__ import annotations

from gateway.broker.memory import MemoryBroker

from .helpers import Wire, fetch_params, run_service, unique, values

T = "orders"


params = fetch_params


def broker(queues: int = 2, records: int = 5) -> MemoryBroker:
    b = MemoryBroker()
    b.create(T, queues)
    for q in range(queues):
        b.append(T, str(q), *[f"q{q}v{i}" for i in range(records)])
    return b


async def wipe(w: Wire, group: str, client_id: str = "") -> None:
    """What FLUSHALL does to one consumer: its queue hash is gone."""
    await w.store.redis.delete(w.store.queues_key(group, client_id))


def test_round_copies_moved_offsets_and_restore_seeds_them(redis_url: str) -> None:
    b = broker()
    g = unique()

    async def body(w: Wire) -> None:
        ck = w.svc.checkpoints
        assert ck is not None and ck.enabled
        first = await w.fetch(params(g, max_messages=3))  # start earliest: q?v0..v2
        # every queue's first position went to the group before Redis got it
        assert b.groups["mqgw." + g] == {(T, "0"): 0, (T, "1"): 0}
        await w.ack(first["requestId"])
        assert await ck.round([g]) == 1  # the one that moved
        assert b.groups["mqgw." + g] == {(T, first["queue"]): 3, (T, other(first["queue"])): 0}
        assert await ck.round([g]) == 0  # nothing moved: nothing sent
        await wipe(w, g)
        again = await w.fetch(params(g, max_messages=10))
        # the larger backlog first: the other queue, restored at 0
        assert values(again) == [f"q{other(first['queue'])}v{i}" for i in range(5)]
        # flagged: below the end of the log at the restore, it may have been delivered before
        assert again["redelivered"] is True
        # and the first one resumed at its checkpoint, not at `start` (earliest: v0 again)
        states = {q.queue: q for q in await w.store.queue_states(g)}
        assert states[first["queue"]].committed == 3 and states[first["queue"]].checkpointed == 3
    run_service(redis_url, b, body, checkpoint_interval_ms=1000)


def other(q: str) -> str:
    return "1" if q == "0" else "0"


def test_a_new_queue_starts_at_start_written_to_the_checkpoint_first(redis_url: str) -> None:
    """A new consumer's queues, and a partition added later, get their `start` position in the
    broker's group before Redis has it (a Redis lost before the first round must not send them
    to the default `latest`); the group is asked once per new set of queues."""
    b = broker()
    g = unique()
    calls: list[str] = []
    load = b.load_offsets

    async def counting(group: str, topic: str, queues: list[str] | None = None) -> dict[str, int]:
        calls.append(group)
        return await load(group, topic, queues)
    b.load_offsets = counting  # type: ignore[method-assign]

    async def body(w: Wire) -> None:
        r = await w.fetch(params(g, max_messages=1))
        assert values(r) in (["q0v0"], ["q1v0"])  # earliest, as configured
        await w.ack(r["requestId"])
        await w.ack((await w.fetch(params(g, max_messages=1)))["requestId"])
        assert calls == ["mqgw." + g]  # once: every queue has a position now
        assert b.groups["mqgw." + g] == {(T, "0"): 0, (T, "1"): 0}
        b.create(T, 3)  # a partition added later starts at `start`, written to the group first
        b.append(T, "2", "q2v0")
        seen = set()
        for _ in range(12):
            got = await w.fetch(params(g, max_messages=10, wait_ms=200))
            if got["status"] == "ok":
                seen.add(got["queue"])
                await w.ack(got["requestId"])
        assert "2" in seen and calls == ["mqgw." + g] * 2
        assert b.groups["mqgw." + g][(T, "2")] == 0
    run_service(redis_url, b, body, checkpoint_interval_ms=1000)


def test_broadcast_clients_are_neither_checkpointed_nor_restored(redis_url: str) -> None:
    b = broker(queues=1)
    g = unique()

    async def body(w: Wire) -> None:
        ck = w.svc.checkpoints
        assert ck is not None
        r = await w.fetch(params(g, client_id="c1", max_messages=2))
        await w.ack(r["requestId"])
        assert await ck.round([g]) == 0 and "mqgw." + g not in b.groups
        await wipe(w, g, "c1")
        again = await w.fetch(params(g, client_id="c1", max_messages=10))
        assert values(again)[0] == "q0v0"  # its `start` (earliest), as a new clientId
    run_service(redis_url, b, body, checkpoint_interval_ms=1000)


def test_a_hash_left_with_only_checkpoint_marks_is_not_taken_for_offset_zero(redis_url: str) -> None:
    """A round that read offsets before FLUSHALL writes its ``ckp`` marks into an emptied hash;
    the next round must not copy ``committed`` 0 (a missing field) over the group's offsets."""
    b = broker(queues=1)
    g = unique()

    async def body(w: Wire) -> None:
        ck = w.svc.checkpoints
        assert ck is not None
        r = await w.fetch(params(g, max_messages=4))
        await w.ack(r["requestId"])
        assert await ck.round([g]) == 1 and b.groups["mqgw." + g] == {(T, "0"): 4}
        await wipe(w, g)
        await w.store.mark_checkpointed(g, T, {"0": 4})  # the late write of a round in flight
        assert await ck.round([g]) == 0 and b.groups["mqgw." + g] == {(T, "0"): 4}
    run_service(redis_url, b, body, checkpoint_interval_ms=1000)


def test_a_busy_round_copies_only_consumers_far_ahead_of_their_checkpoint(redis_url: str) -> None:
    """Between full rounds (every checkpoint_interval_ms) a round every second copies only the
    consumers' topics at least checkpoint_busy_records ahead: a Redis loss redelivers about a
    second of a busy consumer's work, and the quiet ones cost no offset commit each second."""
    b = broker(queues=2, records=10)
    busy, quiet = unique(), unique()

    async def body(w: Wire) -> None:
        ck = w.svc.checkpoints
        assert ck is not None and ck.busy_records == 4
        for g, n in ((busy, 5), (quiet, 3)):
            r = await w.fetch(params(g, max_messages=n))  # one queue; both start at 0 (earliest)
            await w.ack(r["requestId"])
        assert await ck.round([busy, quiet], busy_only=True) == 1  # busy's moved queue only
        assert {o for (_, _), o in b.groups["mqgw." + busy].items()} == {0, 5}
        assert sorted(b.groups["mqgw." + quiet].values()) == [0, 0]  # its start, not its 3
        assert await ck.round([busy, quiet]) == 1  # the full round: quiet's too
        assert sorted(b.groups["mqgw." + quiet].values()) == [0, 3]
    run_service(redis_url, b, body, checkpoint_interval_ms=1000, checkpoint_busy_records=4)
