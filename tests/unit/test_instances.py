"""REST v2 consumer instances (gateway/core/instances.py) over fakeredis and the memory broker:
what a call leaves in the instance's hash, and what happens to its batches."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker.memory import MemoryBroker
from gateway.core import instances as inst_mod
from gateway.core.auth import Authorizer, KeyStore
from gateway.core.errors import Conflict, Forbidden, NotFound
from gateway.core.instances import Format, InstanceService

from .conftest import Clock, Gateway

pytestmark = pytest.mark.anyio
G = "g"


def service(gw: Gateway) -> InstanceService:
    return InstanceService(gw.settings, gw.store, gw.consume,
                           Authorizer(gw.settings.auth, KeyStore(gw.store)), gw.registry,
                           gw.checkpoints)


async def make(svc: InstanceService, name: str = "i", commit: bool = True, **kw: Any) -> None:
    await svc.create(None, G, name, Format.BINARY, "earliest", commit, 0, kw.get("max", 1))
    await svc.subscribe(None, G, name, ["t"])


async def records(svc: InstanceService, name: str = "i") -> list[bytes | None]:
    _, got, _ = await svc.records(None, G, name, None, 0, 0, "unit")
    return [r.value for r in got.batch.records] if got.batch else []


async def test_each_fetch_is_pending_until_the_next_one_commits_it(
        gw: Gateway, broker: MemoryBroker) -> None:
    broker.create("t", 1)
    broker.append("t", "0", "a", "b")
    svc = service(gw)
    await make(svc)
    assert await records(svc) == [b"a"]
    assert len((await svc.get(None, G, "i")).pending) == 1
    assert await records(svc) == [b"b"]  # "a" committed on the way
    [q] = await gw.store.queue_states(G)
    assert q.committed == 1 and len((await svc.get(None, G, "i")).pending) == 1
    await svc.delete(None, G, "i")  # auto-commit: committed at close
    assert (await gw.store.queue_states(G))[0].committed == 2
    with pytest.raises(NotFound):
        await svc.get(None, G, "i")


async def test_the_oldest_pending_batches_are_forgotten_past_the_cap(
        gw: Gateway, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inst_mod, "MAX_PENDING", 2)
    broker.create("t", 4)
    for q in "0123":
        broker.append("t", q, f"v{q}")
    svc = service(gw)
    await make(svc, commit=False)
    for _ in range(4):
        assert len(await records(svc)) == 1
    assert len((await svc.get(None, G, "i")).pending) == 2


async def test_a_commit_after_the_lock_ran_out_names_the_lost_batch(
        gw: Gateway, broker: MemoryBroker, clock: Clock) -> None:
    broker.create("t", 1)
    broker.append("t", "0", "a")
    svc = service(gw)
    await make(svc, commit=False)
    await make(svc, "other", commit=False)
    assert await records(svc) == [b"a"]
    clock.advance(gw.settings.consume_timeout_ms + 1)
    assert await records(svc, "other") == [b"a"]  # redelivered to the other instance
    done = await svc.commit(None, G, "i", None)
    assert [r.queue for r in done.lost] == ["0"]
    assert not (await svc.get(None, G, "i")).pending  # it can never commit: forgotten


async def test_an_instance_deleted_while_it_fetched_hands_the_batch_back(
        gw: Gateway, broker: MemoryBroker) -> None:
    broker.create("t", 1)
    broker.append("t", "0", "a")
    svc = service(gw)
    await make(svc)
    real = gw.store.instances.update

    async def gone(*a: Any, **kw: Any) -> bool:  # another node deleted it meanwhile
        await gw.store.instances.delete(G, "i")
        return await real(*a, **kw)
    gw.store.instances.update = gone  # type: ignore[method-assign]
    with pytest.raises(NotFound):
        await records(svc)
    gw.store.instances.update = real  # type: ignore[method-assign]
    await make(svc, "j")
    assert await records(svc, "j") == [b"a"]  # not locked for the lock timeout


async def test_names_and_subscriptions(gw: Gateway, broker: MemoryBroker) -> None:
    svc = service(gw)
    i = await svc.create(None, G, None, Format.JSON, "", True, None, None)
    assert i.name.startswith("rest-consumer-") and i.max_records == gw.settings.default_max_messages
    with pytest.raises(Conflict):
        await svc.create(None, G, i.name, Format.JSON, "", True, None, None)
    with pytest.raises(Conflict):  # not subscribed
        await svc.records(None, G, i.name, None, 0, 0, "unit")
    await svc.subscribe(None, G, i.name, ["a", "b", "a"])
    assert (await svc.get(None, G, i.name)).topics == ("a", "b")


async def test_a_registered_group_is_subscribed_only_to_its_topics(gw: Gateway) -> None:
    """Refused at the subscription, not at the first fetch after a 204 (a new user's trap)."""
    svc = service(gw)
    await gw.registry.put_consumer(G, {"topics": ",orders,"})  # as the admin API stores it
    i = await svc.create(None, G, "i", Format.JSON, "", True, None, None)
    with pytest.raises(Forbidden) as e:
        await svc.subscribe(None, G, i.name, ["orders", "demo"])
    assert e.value.code == "topic_not_allowed" and "'demo'" in str(e.value)
    assert (await svc.get(None, G, i.name)).topics == ()  # nothing was subscribed
    await svc.subscribe(None, G, i.name, ["orders"])
    assert (await svc.get(None, G, i.name)).topics == ("orders",)


async def test_without_auto_commit_records_read_no_instance_and_follow_changes_elsewhere(
        make_gateway: Any, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node remembers a no-auto-commit instance's settings: its ``records`` cost the fetch
    and one write, no read. A subscription made on another node meanwhile is followed (the
    write finds another version: the batch is handed back and the call made again), and a
    deletion there is a 404 here."""
    broker.create("t", 1)
    broker.create("u", 1)
    broker.append("t", "0", "t0", "t1", "t2")
    broker.append("u", "0", "u0")
    a, b = service(make_gateway()), service(make_gateway())
    await make(a, commit=False)
    assert await records(a) == [b"t0"]
    loads = 0
    real = a.instances.load

    async def counted(*args: Any, **kw: Any) -> Any:
        nonlocal loads
        loads += 1
        return await real(*args, **kw)
    monkeypatch.setattr(a.instances, "load", counted)
    await a.commit(None, G, "i", None)
    assert await records(a) == [b"t1"] and loads == 0
    await a.commit(None, G, "i", None)
    await b.subscribe(None, G, "i", ["u"])
    assert await records(a) == [b"u0"]  # not t2, fetched on the old settings and handed back
    [t] = [q for q in await a.store.queue_states(G) if q.topic == "t"]
    assert t.committed == 2 and t.lock_ms == 0
    await b.delete(None, G, "i")
    with pytest.raises(NotFound):
        await records(a)


async def test_a_commit_of_all_acks_every_pending_batch_in_one_script(
        gw: Gateway, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    broker.create("t", 2)
    broker.append("t", "0", "a")
    broker.append("t", "1", "b")
    svc = service(gw)
    await make(svc, commit=False)
    assert len(await records(svc)) == 1 and len(await records(svc)) == 1
    calls = 0
    real = gw.store.redis.evalsha

    async def counted(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        return await real(*args, **kw)
    monkeypatch.setattr(gw.store.redis, "evalsha", counted)
    done = await svc.commit(None, G, "i", None)
    assert calls == 1 and len(done.acked) == 2 and not done.lost
    assert sorted(q.committed for q in await gw.store.queue_states(G)) == [1, 1]
    assert not (await svc.get(None, G, "i")).pending


async def test_a_batch_pending_from_an_older_gateway_is_committed_by_its_request_id(
        gw: Gateway, broker: MemoryBroker) -> None:
    """Before 2026-11-28 a pending batch's value was only when it was fetched: the script
    leaves it, and the service acks it by its requestId."""
    broker.create("t", 1)
    broker.append("t", "0", "a")
    svc = service(gw)
    await make(svc, commit=False)
    assert await records(svc) == [b"a"]
    key = gw.store.layout.instance(G, "i")
    [field] = [f for f in await gw.store.redis.hkeys(key) if f.startswith(b"b:")]
    await gw.store.redis.hset(key, field, "1795800000000")
    done = await svc.commit(None, G, "i", None)
    assert len(done.acked) == 1 and not done.lost
    assert (await gw.store.queue_states(G))[0].committed == 1
    assert not (await svc.get(None, G, "i")).pending


async def test_with_auto_commit_records_commit_the_last_batch_without_reading_the_instance(
        gw: Gateway, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    broker.create("t", 1)
    broker.append("t", "0", "a", "b")
    svc = service(gw)
    await make(svc)
    assert await records(svc) == [b"a"]
    monkeypatch.setattr(svc.instances, "load", None)  # a read now would fail the call
    assert await records(svc) == [b"b"]  # "a" committed first, by one script
    [q] = await gw.store.queue_states(G)
    assert q.committed == 1
    monkeypatch.undo()
    assert len((await svc.get(None, G, "i")).pending) == 1
