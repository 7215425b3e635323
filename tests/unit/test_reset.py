"""Offset resets (core/reset.py over reset.lua): earliest, latest, a time, an offset; a batch
fetched before a reset can no longer commit; broadcast clientIds; the checkpoint follows."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker.memory import MemoryBroker
from gateway.core.errors import DomainError
from gateway.core.reset import ResetRequest, reset

from .conftest import Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "c1"


@pytest.fixture
def topic(broker: MemoryBroker) -> str:
    broker.create(T, 2)
    for q in ("0", "1"):
        for i in range(10):
            broker.append(T, q, f"{q}-{i}", timestamp=1_000 * i)
    broker.delete_before(T, "1", 4)  # queue 1's log starts at 4
    return T


async def committed(gw: Gateway, client: str = "") -> dict[str, int]:
    return {q.queue: q.committed for q in await gw.store.queue_states(C, client)}


async def do(gw: Gateway, cfg: dict[str, str] | None = None, **req: Any) -> Any:
    return await reset(gw.store, gw.broker, C, ResetRequest(topic=T, **req), cfg or {},
                       checkpoints=gw.checkpoints)


async def test_earliest_latest_time_and_offset(gw: Gateway, topic: str) -> None:
    r = await do(gw, to="latest")
    assert await committed(gw) == {"0": 10, "1": 10}
    assert r.moved == 2 and {m.before for m in r.queues} == {None}  # new queues
    r = await do(gw, to="earliest")
    assert await committed(gw) == {"0": 0, "1": 4}  # the low watermark, not 0
    assert sorted((m.queue, m.before, m.after) for m in r.queues) == [("0", 10, 0), ("1", 10, 4)]
    await do(gw, to="timestamp", timestamp=6_500)
    assert await committed(gw) == {"0": 7, "1": 7}  # the first record at or after the time
    await do(gw, to="timestamp", timestamp=99_000)
    assert await committed(gw) == {"0": 10, "1": 10}  # none that late: the end
    r = await do(gw, to="offset", queue="1", offset=5)
    assert await committed(gw) == {"0": 10, "1": 5} and r.moved == 1


async def test_the_next_fetch_starts_at_the_reset_and_a_held_batch_cannot_commit(
        gw: Gateway, topic: str) -> None:
    held = await gw.fetch(C, max_messages=3)
    assert held.batch is not None
    await do(gw, to="offset", queue=held.batch.queue, offset=8)
    r = await gw.consume.ack(held.batch.request_id)
    assert (r.result, r.committed) == ("offset_reset", 8)
    other = "1" if held.batch.queue == "0" else "0"
    await do(gw, to="latest", queue=other)
    got = await gw.fetch(C, max_messages=50)  # the reset freed the queue: no wait for the lock
    assert got.batch and (got.batch.queue, got.batch.offset) == (held.batch.queue, 8)
    assert [r.value for r in got.batch.records] == [f"{held.batch.queue}-{i}".encode() for i in (8, 9)]


@pytest.mark.parametrize("req,code", [
    (dict(to="nowhere"), "invalid_to"),
    (dict(to="offset", offset=3), "queue_required"),
    (dict(to="offset", queue="0", offset="3"), "invalid_offset"),
    (dict(to="offset", queue="0", offset=11), "offset_out_of_range"),
    (dict(to="offset", queue="1", offset=3), "offset_out_of_range"),  # below the low watermark
    (dict(to="earliest", queue="7"), "unknown_queue"),
    (dict(to="earliest", queue=True), "invalid_queue"),
    (dict(to="timestamp", timestamp="yesterday"), "invalid_timestamp"),
    (dict(to="timestamp", timestamp=-1), "invalid_timestamp"),
    (dict(to="earliest", client_id="bad:id"), "invalid_client_id"),
])
async def test_bad_resets_are_refused_and_change_nothing(
        gw: Gateway, topic: str, req: dict[str, Any], code: str) -> None:
    with pytest.raises(DomainError) as e:
        await do(gw, **req)
    assert e.value.code == code
    assert await committed(gw) == {}


async def test_a_registration_limits_topics_and_mode(gw: Gateway, topic: str) -> None:
    cluster = {"registered": "1", "topics": ",other,", "mode": "cluster"}
    with pytest.raises(DomainError) as e:
        await do(gw, cluster, to="earliest")
    assert e.value.code == "topic_not_allowed"
    cluster["topics"] = f",{T},"
    with pytest.raises(DomainError) as e:
        await do(gw, cluster, to="earliest", client_id="c")
    assert e.value.code == "client_id_not_allowed"
    with pytest.raises(DomainError) as e:
        await do(gw, {**cluster, "mode": "broadcast"}, to="earliest")
    assert e.value.code == "client_id_required"


async def test_broadcast_clients_one_or_all(gw: Gateway, topic: str) -> None:
    for client in ("a", "b"):
        got = await gw.fetch(C, client_id=client, max_messages=2)
        assert got.batch is not None
        await gw.consume.ack(got.batch.request_id)
    await do(gw, to="offset", queue="0", offset=6, client_id="a")
    assert (await committed(gw, "a"))["0"] == 6 and (await committed(gw, "b")).get("0", 0) != 6
    r = await do(gw, to="latest", client_id="*")
    assert {m.client_id for m in r.queues} == {"a", "b"}
    assert await committed(gw, "a") == await committed(gw, "b") == {"0": 10, "1": 10}
    assert await committed(gw) == {}  # cluster offsets untouched


async def test_a_reset_is_written_to_the_checkpoint_at_once(
        make_gateway: Any, broker: MemoryBroker, topic: str) -> None:
    gw = make_gateway(checkpoint_interval_ms=60_000)
    await do(gw, to="offset", queue="0", offset=3)
    assert broker.groups["mqgw." + C] == {(T, "0"): 3}


async def test_a_dry_run_says_what_would_move_and_moves_nothing(gw: Gateway, topic: str) -> None:
    await do(gw, to="latest")
    held = await gw.fetch(C)  # nothing to read at the end; the lock tokens must stay too
    assert held.batch is None
    before = await gw.store.redis.hgetall(gw.store.queues_key(C))
    r = await do(gw, to="earliest", dry_run=True)
    assert r.dry_run and r.moved == 2
    assert sorted((m.queue, m.before, m.after) for m in r.queues) == [("0", 10, 0), ("1", 10, 4)]
    assert await gw.store.redis.hgetall(gw.store.queues_key(C)) == before  # not a field changed
    r = await do(gw, to="offset", queue="1", offset=5, dry_run=True)
    assert [(m.queue, m.before, m.after) for m in r.queues] == [("1", 10, 5)]
    with pytest.raises(DomainError) as e:
        await do(gw, to="latest", dry_run="yes")
    assert e.value.code == "invalid_dry_run"


async def test_a_dry_run_on_a_consumer_that_never_read_shows_no_offsets(
        gw: Gateway, topic: str) -> None:
    r = await do(gw, to="earliest", dry_run=True)
    assert sorted((m.queue, m.before, m.after) for m in r.queues) == [("0", None, 0), ("1", None, 4)]
    assert await committed(gw) == {}
