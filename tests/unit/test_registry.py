"""Consumer registrations (core/registry.py, api/registry_wire.py): what a registration holds,
unregistering with and without the offsets, pause and resume, and bad settings refused."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.registry_wire import consumer_fields
from gateway.broker.memory import MemoryBroker
from gateway.core.errors import DomainError, Forbidden, Invalid, NotFound

from .conftest import Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "c1"


@pytest.fixture
def sec(make_gateway: Any, broker: MemoryBroker) -> Gateway:
    broker.create(T, 1)
    broker.append(T, "0", "a", "b", "c")
    gw: Gateway = make_gateway(open_mode=False)
    return gw


async def register(gw: Gateway, consumer: str = C, **body: Any) -> Any:
    return await gw.registry.put_consumer(consumer, consumer_fields({"topics": [T], **body}, whole=True))


async def test_unregister_keeps_offsets_unless_asked_to_delete_them(sec: Gateway) -> None:
    await register(sec)
    first = await sec.fetch(C, max_messages=1)
    assert first.batch is not None
    await sec.consume.ack(first.batch.request_id)
    out = await sec.registry.delete_consumer(C, delete_offsets=False)
    assert out.unregistered and not out.offsets_deleted
    with pytest.raises(Forbidden) as e:
        await sec.fetch(C)
    assert e.value.code == "unregistered_consumer"
    await register(sec)
    again = await sec.fetch(C, max_messages=1)
    assert again.batch and again.batch.records[0].value == b"b"  # resumed at the committed offset
    await sec.consume.unlock(again.batch.request_id)
    out = await sec.registry.delete_consumer(C, delete_offsets=True)
    assert out.offsets_deleted and out.keys_deleted >= 1
    assert not await sec.store.redis.exists(sec.store.queues_key(C), sec.store.config_key(C))
    await register(sec)
    fresh = await sec.fetch(C, max_messages=1)
    assert fresh.batch and fresh.batch.records[0].value == b"a"  # offsets gone: from the start
    with pytest.raises(NotFound):
        await sec.registry.get_consumer("never-seen")


async def test_a_null_mode_registers_the_default_mode(sec: Gateway) -> None:
    rec, created = await register(sec, mode=None)
    assert created and rec.fields["mode"] == "cluster"
    with pytest.raises(Invalid) as e:
        await sec.fetch(C, client_id="c1")
    assert e.value.code == "client_id_not_allowed"
    _, created = await register(sec)
    assert not created


async def test_pause_and_resume_apply_at_once(sec: Gateway) -> None:
    await register(sec)
    assert await sec.registry.set_paused(C, True) is False  # not created: registered already
    assert (await sec.fetch(C)).status == "paused"
    await sec.registry.set_paused(C, False)
    assert (await sec.fetch(C)).batch is not None
    with pytest.raises(NotFound):  # outside open mode, a typo fails instead of pausing a name
        await sec.registry.set_paused("typo", True)


async def test_a_registration_is_the_whole_truth_a_patch_changes_only_what_it_names(sec: Gateway) -> None:
    await register(sec, consumeTimeoutMs=5000, retry={"delaysMs": [100, 200]})
    rec = await sec.registry.patch_consumer(C, consumer_fields({"retry": {"maxAttempts": 4}}))
    assert (rec.fields["retry_delays_ms"], rec.fields["retry_max_attempts"]) == ("100,200", "4")
    assert rec.fields["consume_timeout_ms"] == "5000"
    rec, _ = await register(sec)  # a PUT replaces everything
    assert "retry_delays_ms" not in rec.fields and "consume_timeout_ms" not in rec.fields
    with pytest.raises(Invalid) as e:
        await sec.registry.patch_consumer(C, {"topics": None})
    assert e.value.code == "invalid_topics"


@pytest.mark.parametrize("body,code", [
    ({"retry": {"delaysMs": []}}, "invalid_retry"),
    ({"retry": {"delaysMs": [-1]}}, "invalid_retry"),
    ({"retry": {"delaysMs": "1s"}}, "invalid_retry"),
    ({"retry": {"maxAttempts": 0}}, "invalid_retry"),
    ({"mode": "fanout"}, "invalid_mode"),
    ({"start": "middle"}, "invalid_start"),
    ({"consumeTimeoutMs": 5}, "invalid_consume_timeout_ms"),
    ({"paused": "yes"}, "invalid_paused"),
    ({"rateLimit": {"burst": 5}}, "invalid_rate_limit"),
    ({"rateLimit": {"messagesPerSecond": 0}}, "invalid_rate_limit"),
    ({"topics": ["mqgw.delay.100ms"]}, "internal_topic"),
    ({"retry": {"delaysMs": [5], "multiplier": 2}}, "conflicting_retry"),
    ({"group": "x"}, "unknown_field"),
])
async def test_bad_settings_are_refused_and_change_nothing(sec: Gateway, body: dict[str, Any],
                                                           code: str) -> None:
    await register(sec)
    before = await sec.registry.config(C)
    with pytest.raises(DomainError) as e:
        await sec.registry.patch_consumer(C, consumer_fields(body))
    assert e.value.code == code
    assert await sec.registry.config(C) == before
