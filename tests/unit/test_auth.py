"""API keys and registrations as the consume scripts enforce them (core/auth.py, choose.lua,
ack.lua, unlock.lua, produce_check.lua, the prelude's constant-time digest check): who may
fetch, ack and produce, and that refused callers leave nothing behind."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.broker.memory import MemoryBroker
from gateway.core.auth import KeyStore, credential_of
from gateway.core.errors import DomainError, Forbidden, Invalid, Unauthenticated
from gateway.store import Credential

from .conftest import Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "billing"


@pytest.fixture
def sec(make_gateway: Any, broker: MemoryBroker) -> Gateway:
    broker.create(T, 1)
    broker.create("other", 1)
    broker.append(T, "0", "a", "b", "c")
    gw: Gateway = make_gateway(auth=True, open_mode=False)
    return gw


async def key(gw: Gateway, **grants: Any) -> Credential:
    raw, _ = await KeyStore(gw.store).create("k", **grants)
    return credential_of(raw)


async def test_a_consumer_key_fetches_and_acks_only_as_its_consumer(sec: Gateway) -> None:
    await sec.registry.put_consumer(C, {"topics": f",{T},"})
    await sec.registry.put_consumer("g2", {"topics": f",{T},"})
    mine, other = await key(sec, consumers=[C]), await key(sec, consumers=["g2"])
    got = await sec.fetch(C, credential=mine, max_messages=1)
    assert got.batch is not None
    with pytest.raises(Forbidden) as e:  # a valid key, of someone else
        await sec.fetch(C, credential=other)
    assert e.value.code == "forbidden"
    with pytest.raises(Forbidden):
        await sec.consume.ack(got.batch.request_id, other)
    with pytest.raises(Forbidden):
        await sec.consume.unlock(got.batch.request_id, other)
    wrong_secret = Credential(mine.key_id, "0" * 64)
    with pytest.raises(Unauthenticated) as u:
        await sec.consume.ack(got.batch.request_id, wrong_secret)
    assert u.value.code == "invalid_api_key"
    assert (await sec.store.queue_states(C))[0].committed == 0  # none of those committed
    assert (await sec.consume.ack(got.batch.request_id, mine)).result == "committed"


async def test_unknown_and_revoked_keys_are_unauthenticated_everywhere(sec: Gateway) -> None:
    await sec.registry.put_consumer(C, {"topics": f",{T},"})
    raw, rec = await KeyStore(sec.store).create("k", consumers=[C])
    cred = credential_of(raw)
    assert (await sec.fetch(C, credential=cred, max_messages=1)).batch is not None
    await KeyStore(sec.store).revoke(rec.id)
    for c in (cred, Credential("0123456789abcdef", cred.sha256)):
        with pytest.raises(Unauthenticated):
            await sec.fetch(C, credential=c)
        with pytest.raises(Unauthenticated):  # before a 404: no topic probing without a key
            await sec.fetch(C, topic="no-such-topic", credential=c)
    for bad in ("", "not-a-key", "mqgw_0123_short"):
        with pytest.raises(Unauthenticated):
            credential_of(bad)


async def test_registrations_hold_consumers_to_their_topics_and_mode(sec: Gateway) -> None:
    cred = await key(sec, consumers=[C, "bc"])
    with pytest.raises(Forbidden) as e:
        await sec.fetch(C, credential=cred)
    assert e.value.code == "unregistered_consumer"
    await sec.registry.put_consumer(C, {"topics": ",other,"})
    with pytest.raises(Forbidden) as f:
        await sec.fetch(C, credential=cred)
    assert f.value.code == "topic_not_allowed"
    await sec.registry.put_consumer(C, {"topics": f",{T},"})
    with pytest.raises(Invalid) as i:
        await sec.fetch(C, credential=cred, client_id="x")
    assert i.value.code == "client_id_not_allowed"
    await sec.registry.put_consumer("bc", {"topics": f",{T},", "mode": "broadcast"})
    with pytest.raises(Invalid) as i:
        await sec.fetch("bc", credential=cred)
    assert i.value.code == "client_id_required"
    assert (await sec.fetch("bc", credential=cred, client_id="x")).batch is not None


async def test_open_mode_serves_unregistered_names_but_holds_registered_ones(
        make_gateway: Any, broker: MemoryBroker) -> None:
    broker.create(T, 1)
    broker.append(T, "0", "a")
    gw = make_gateway(open_mode=True)
    assert (await gw.fetch("anyone")).batch is not None
    await gw.registry.put_consumer(C, {"topics": ",other,"})
    with pytest.raises(Forbidden):
        await gw.fetch(C)


async def test_refused_callers_leave_no_consumer_names_behind(sec: Gateway) -> None:
    bogus = Credential("0000000000000000", "0" * 64)
    for cred in (bogus, None):
        with pytest.raises(DomainError):
            await sec.fetch("junk", credential=cred)
    await sec.registry.put_consumer(C, {"topics": f",{T},"})
    assert (await sec.fetch(C, credential=await key(sec, consumers=[C]))).batch is not None
    _registered, seen = await sec.registry.consumer_names()
    assert C in _registered | seen and "junk" not in _registered | seen


async def test_produce_check_verdicts(sec: Gateway) -> None:
    store = sec.store
    await sec.registry.put_producer("orders-svc", [T])
    prod = await key(sec, producers=["orders-svc"])
    cons = await key(sec, consumers=[C])
    assert await store.produce_check(prod, False, "", T) == ("ok", "orders-svc")
    assert (await store.produce_check(prod, False, "", "other"))[0] == "topic_not_allowed"
    assert (await store.produce_check(cons, False, "", T))[0] == "forbidden"
    assert (await store.produce_check(Credential(prod.key_id, "0" * 64), False, "", T))[0] \
        == "unauthenticated"
