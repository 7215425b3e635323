"""Admin and registration JSON (api/admin_wire.py, api/registry_wire.py) around the real
services: a registration read back with its defaults, a reset's request and answer, keys,
redrive requests and the dead-letter page."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.admin_wire import (
    dead_page_body,
    key_body,
    key_request,
    redrive_request,
    reset_body,
    reset_request,
)
from gateway.api.registry_wire import consumer_body, delete_body, registration_fields
from gateway.broker.memory import MemoryBroker
from gateway.core.auth import KeyStore
from gateway.core.deadletters import DeadLetters, RedriveTarget
from gateway.core.delay import DelayService
from gateway.core.errors import DomainError
from gateway.core.nack import NackService
from gateway.core.reset import reset

from .conftest import Gateway

pytestmark = pytest.mark.anyio

T = "orders"
C = "c1"


@pytest.fixture(autouse=True)
def records(broker: MemoryBroker) -> None:
    broker.create(T, 2)
    broker.append(T, "1", "a", "b", "c")


async def test_a_registration_as_the_api_shows_it(gw: Gateway) -> None:
    rec, created = await gw.registry.put_consumer(C, registration_fields({
        "topics": [T], "mode": None, "rateLimit": {"messagesPerSecond": 2.5},
        "retry": {"delaysMs": [100, 200], "deadLetterTopic": "dl"}}))
    body = consumer_body(rec, gw.settings)
    assert created and body["consumer"] == C and body["registered"] is True
    assert (body["topics"], body["mode"], body["start"]) == ([T], "cluster", "earliest")
    assert body["rateLimit"] == {"messagesPerSecond": 2.5, "burst": 2}
    assert body["retry"] == {"delaysMs": [100, 200], "deadLetterTopic": "dl"}
    assert body["consumeTimeoutMs"] == gw.settings.consume_timeout_ms and body["paused"] is False
    with pytest.raises(DomainError) as e:
        registration_fields({"mode": "cluster"})
    assert e.value.code == "missing_topics"
    out = delete_body(await gw.registry.delete_consumer(C, delete_offsets=False))
    assert out == {"consumer": C, "unregistered": True, "offsetsDeleted": False, "keysDeleted": 0}


async def test_a_reset_request_and_its_answer(gw: Gateway) -> None:
    req = reset_request({"topic": T, "to": "offset", "queue": 1.0, "offset": 2})
    assert (req.queue, req.offset) == (1, 2)
    r = await reset(gw.store, gw.broker, C, req, {})
    assert reset_body(r) == {"consumer": C, "topic": T, "to": "offset", "moved": 1,
                             "queues": [{"clientId": None, "queue": "1", "from": None, "to": 2}]}
    for body, code in (({"topic": T, "to": "latest", "queue": None}, "invalid_queue"),
                       ({"topic": T, "to": "latest", "group": C}, "unknown_field")):
        with pytest.raises(DomainError) as e:
            reset_request(body)
        assert e.value.code == code


async def test_keys_never_show_their_digest(gw: Gateway) -> None:
    name, admin, producers, consumers = key_request({"name": "svc", "consumers": [C]})
    _, rec = await KeyStore(gw.store).create(name, admin=admin, producers=producers,
                                             consumers=consumers)
    body = key_body(rec)
    assert body["consumers"] == [C] and body["admin"] is False and rec.sha256 not in body.values()
    with pytest.raises(DomainError) as e:
        key_request({"name": "svc"})
    assert e.value.code == "empty_grant"


@pytest.mark.parametrize("body,code", [
    ({"target": "elsewhere"}, "invalid_target"), ({"partition": -1}, "invalid_partition"),
    ({"limit": 0}, "invalid_limit"), ({"toOffset": "x"}, "invalid_to_offset"),
])
def test_bad_redrives(body: dict[str, Any], code: str) -> None:
    with pytest.raises(DomainError) as e:
        redrive_request(body)
    assert e.value.code == code


async def test_the_dead_letter_page(gw: Gateway) -> None:
    assert redrive_request({}) == (RedriveTarget.CONSUMER, None, None, None)
    await gw.registry.patch_consumer(C, {"retry_max_attempts": "1"})
    nack = NackService(gw.settings, gw.store, gw.broker, gw.consume,
                       DelayService(gw.settings, gw.store, gw.broker))
    got = await gw.fetch(C)
    assert got.batch is not None
    await nack.fail(got.batch.request_id, {1: None})
    page = dead_page_body(await DeadLetters(gw.settings, gw.store, gw.broker, gw.consume.wm)
                          .page(C, limit=10), "utf8")
    assert (page["deadLetterTopic"], page["exists"], page["count"]) == ("mqgw.dead." + C, True, 1)
    m, = page["messages"]
    assert (m["value"], m["attempt"]) == ("b", 1) and isinstance(m["partition"], int)
    assert page["oldestMs"] is not None and page["partitions"][0]["redrivenOffset"] == 0
