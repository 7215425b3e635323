"""Checkpoint and restore rules (core/checkpoint.py, restore.lua, choose.lua's "restore first"
answer) over the memory broker's consumer groups: what a round copies, what a restore seeds,
and which batches a restored queue flags as redelivered."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker.memory import MemoryBroker

from .conftest import Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "c1"
GROUP = "mqgw." + C


@pytest.fixture
def ck(make_gateway: Any, broker: MemoryBroker) -> Gateway:
    broker.create(T, 2)
    for q in range(2):
        broker.append(T, str(q), *[f"q{q}v{i}" for i in range(5)])
    gw: Gateway = make_gateway(checkpoint_interval_ms=1000, checkpoint_busy_records=4)
    assert gw.checkpoints.enabled
    return gw


def values(got: Any) -> list[str]:
    assert got.batch is not None, got
    return [r.value.decode() for r in got.batch.records]


def other(q: str) -> str:
    return "1" if q == "0" else "0"


async def wipe(gw: Gateway, consumer: str = C, client_id: str = "") -> None:
    """What FLUSHALL does to one consumer: its queue hash is gone."""
    await gw.store.redis.delete(gw.store.queues_key(consumer, client_id))


async def test_round_copies_moved_offsets_and_restore_seeds_them(ck: Gateway, broker: MemoryBroker) -> None:
    first = await ck.fetch(C, max_messages=3)
    assert first.batch is not None
    q = first.batch.queue
    # every queue's first position went to the group before Redis got it
    assert broker.groups[GROUP] == {(T, "0"): 0, (T, "1"): 0}
    await ck.consume.ack(first.batch.request_id)
    assert await ck.checkpoints.round([C]) == 1  # the one that moved
    assert broker.groups[GROUP] == {(T, q): 3, (T, other(q)): 0}
    assert await ck.checkpoints.round([C]) == 0  # nothing moved: nothing sent
    await wipe(ck)
    again = await ck.fetch(C, max_messages=10)
    # the larger backlog first: the other queue, restored at 0
    assert values(again) == [f"q{other(q)}v{i}" for i in range(5)]
    # flagged: below the end of the log at the restore, it may have been delivered before
    assert again.batch is not None and again.batch.redelivered
    states = {s.queue: s for s in await ck.store.queue_states(C)}
    assert states[q].committed == 3 and states[q].checkpointed == 3  # not `start` (0) again


async def test_only_batches_below_the_log_end_at_the_restore_are_flagged(
        ck: Gateway, broker: MemoryBroker) -> None:
    broker.groups[GROUP] = {(T, "0"): 2, (T, "1"): 5}  # a checkpoint from before Redis was lost
    got = await ck.fetch(C, max_messages=10)  # Redis has nothing: restored from the group
    assert got.batch and got.batch.queue == "0" and got.batch.offset == 2 and got.batch.redelivered
    await ck.consume.ack(got.batch.request_id)
    broker.append(T, "0", "new")  # written after the restore: never delivered before
    fresh = await ck.fetch(C, max_messages=10, wait_ms=2_000)
    assert values(fresh) == ["new"] and fresh.batch is not None and not fresh.batch.redelivered


async def test_a_new_queue_starts_at_start_written_to_the_checkpoint_first(
        ck: Gateway, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new consumer's queues, and a queue added later, get their `start` position in the
    broker's group before Redis has it; the group is asked once per new set of queues."""
    calls: list[str] = []
    load = broker.load_offsets

    async def counting(group: str, topic: str, queues: list[str] | None = None) -> dict[str, int]:
        calls.append(group)
        return await load(group, topic, queues)
    monkeypatch.setattr(broker, "load_offsets", counting)

    r = await ck.fetch(C, max_messages=1)
    assert values(r) in (["q0v0"], ["q1v0"])  # earliest, as configured
    assert r.batch is not None
    await ck.consume.ack(r.batch.request_id)
    nxt = await ck.fetch(C, max_messages=1)
    assert nxt.batch is not None
    await ck.consume.ack(nxt.batch.request_id)
    assert calls == [GROUP]  # once: every queue has a position now
    assert broker.groups[GROUP] == {(T, "0"): 0, (T, "1"): 0}
    broker.create(T, 3)  # a queue added later starts at `start`, written to the group first
    broker.append(T, "2", "q2v0")
    seen = set()
    for _ in range(6):
        got = await ck.fetch(C, max_messages=10, wait_ms=200)
        if got.batch is not None:
            seen.add(got.batch.queue)
            await ck.consume.ack(got.batch.request_id)
    assert "2" in seen and calls == [GROUP] * 2
    assert broker.groups[GROUP][(T, "2")] == 0


async def test_a_start_written_by_another_nodes_restore_is_not_taken_for_a_lost_redis(
        make_gateway: Any, ck: Gateway, broker: MemoryBroker,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes' first polls restore at once: node A writes the start positions to the group,
    and node B reads the group before A has seeded Redis. B must not take A's fresh start for a
    checkpoint of a lost Redis and flag every batch redelivered (it did on RocketMQ in CI:
    504 of 504 batches of a fault-free run)."""
    b = make_gateway(checkpoint_interval_ms=1000)
    save = broker.save_offsets
    b_seeded: list[int] = []

    async def then_b_restores(group: str, topic: str, offsets: dict[str, int]) -> None:
        await save(group, topic, offsets)
        if not b_seeded:  # B runs its whole restore between A's save and A's seed
            wm = {q: (0, 5) for q in ("0", "1")}
            b_seeded.append(await b.checkpoints.restore(C, T, "earliest", wm))
    monkeypatch.setattr(broker, "save_offsets", then_b_restores)
    got = await ck.fetch(C, max_messages=10)
    assert b_seeded == [2]  # B read A's start from the group and seeded Redis with it
    assert got.batch is not None and got.batch.offset == 0
    assert not got.batch.redelivered  # nothing was ever delivered: not a restore after a loss


async def test_broadcast_clients_are_neither_checkpointed_nor_restored(
        ck: Gateway, broker: MemoryBroker) -> None:
    r = await ck.fetch(C, client_id="c1", max_messages=2)
    assert r.batch is not None
    await ck.consume.ack(r.batch.request_id)
    assert await ck.checkpoints.round([C]) == 0 and GROUP not in broker.groups
    await wipe(ck, C, "c1")
    again = await ck.fetch(C, client_id="c1", max_messages=10)
    assert values(again)[0].endswith("v0")  # its `start` (earliest), as a new clientId


async def test_a_hash_left_with_only_checkpoint_marks_is_not_taken_for_offset_zero(
        ck: Gateway, broker: MemoryBroker) -> None:
    """A round that read offsets before FLUSHALL writes its ``ckp`` marks into an emptied hash;
    the next round must not copy ``committed`` 0 (a missing field) over the group's offsets."""
    r = await ck.fetch(C, max_messages=4)
    assert r.batch is not None
    q = r.batch.queue
    await ck.consume.ack(r.batch.request_id)
    assert await ck.checkpoints.round([C]) == 1 and broker.groups[GROUP][(T, q)] == 4
    await wipe(ck)
    await ck.store.mark_checkpointed(C, T, {q: 4})  # the late write of a round in flight
    assert await ck.checkpoints.round([C]) == 0 and broker.groups[GROUP][(T, q)] == 4


async def test_a_busy_round_copies_only_consumers_far_ahead_of_their_checkpoint(
        ck: Gateway, broker: MemoryBroker) -> None:
    for consumer, n in (("busy", 5), ("quiet", 3)):
        r = await ck.fetch(consumer, max_messages=n)
        assert r.batch is not None
        await ck.consume.ack(r.batch.request_id)
    assert await ck.checkpoints.round(["busy", "quiet"], busy_only=True) == 1
    assert set(broker.groups["mqgw.busy"].values()) == {0, 5}
    assert sorted(broker.groups["mqgw.quiet"].values()) == [0, 0]  # its start, not its 3
    assert await ck.checkpoints.round(["busy", "quiet"]) == 1  # the full round: quiet's too
    assert sorted(broker.groups["mqgw.quiet"].values()) == [0, 3]


async def test_deleting_offsets_forgets_the_group(ck: Gateway, broker: MemoryBroker) -> None:
    r = await ck.fetch(C)
    assert r.batch is not None and GROUP in broker.groups
    await ck.registry.delete_consumer(C, delete_offsets=True)
    assert GROUP not in broker.groups  # a consumer of the same name starts afresh
