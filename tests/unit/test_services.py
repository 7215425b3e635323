"""The whole app in one process: ``create_app`` over fakeredis and the memory broker, through
httpx's ASGI transport. The services are built and closed by the app's lifespan
(``gateway.services``) as on a real node, with a Redis client and a broker handed in."""

from __future__ import annotations

from typing import Any

import fakeredis
import httpx
import pytest

from gateway.api.app import create_app
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings

from .conftest import BASE_SETTINGS

pytestmark = pytest.mark.anyio


async def test_a_round_trip_through_the_app(redis: fakeredis.FakeAsyncRedis,
                                            broker: MemoryBroker) -> None:
    broker.create("orders", 2)
    app = create_app(Settings(**{**BASE_SETTINGS, "alert_interval_ms": 0, "relay": False}), broker=broker,
                     redis=redis)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            r = await http.post("/produce", json={"topic": "orders", "key": "k", "value": "v1"})
            assert r.status_code == 200 and r.json()["failed"] == 0, r.text
            got: dict[str, Any] = (await http.get(
                "/message", params={"consumer": "c1", "topic": "orders"})).json()
            assert got["status"] == "ok" and [m["value"] for m in got["messages"]] == ["v1"]
            r = await http.post("/ack", json={"requestId": got["requestId"]})
            assert (r.status_code, r.json()["result"]) == (200, "committed")
            r = await http.post("/ack", json={"requestId": got["requestId"]})
            assert (r.status_code, r.json()["result"]) == (200, "already_committed")
            # the error handlers: a domain error, a broker error, starlette's own 404
            r = await http.post("/ack", json={})
            assert (r.status_code, r.json()["error"]["code"]) == (400, "missing_request_id")
            r = await http.get("/message", params={"consumer": "c1", "topic": "nope"})
            assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_topic")
            r = await http.get("/nowhere")
            assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
            r = await http.get("/admin/consumers/c1")
            assert r.status_code == 200 and r.json()["consumer"] == "c1", r.text
            # a Schema Registry format without a registry: a clear 400 on both APIs
            for r in (await http.post("/produce", json={"topic": "orders", "encoding": "avro",
                                                        "valueSchemaId": 1, "value": {"a": 1}}),
                      await http.get("/message", params={"consumer": "c1", "topic": "orders",
                                                         "encoding": "protobuf"})):
                assert (r.status_code, r.json()["error"]["code"]) == (400, "no_schema_registry")
    # the caller's client is left open: the services close only what they opened
    assert await redis.ping()


async def test_the_relay_process_runs_the_relay_whatever_the_setting(
        redis: fakeredis.FakeAsyncRedis, broker: MemoryBroker) -> None:
    """``mqgw relay`` (``serve=False``): the relay runs although the HTTP nodes' ``relay`` is
    off, and nothing of a serving node (alerts, the registry copy's watch) is started."""
    from gateway.services import close_services, open_services

    s = await open_services(Settings(**{**BASE_SETTINGS, "relay": False}), broker=broker,
                            redis=redis, serve=False)
    try:
        assert s.relay is not None and s.alerts._task is None
    finally:
        await close_services(s)
    assert await redis.ping()


async def test_the_backlog_view_says_when_its_figures_are_stale(
        redis: fakeredis.FakeAsyncRedis, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """During a broker outage the view answers from the shared copy of the watermarks, and says
    how old it is and why (the console shows it): issue 36."""
    import asyncio

    from gateway.broker import BrokerUnavailable

    broker.create("orders", 1)
    app = create_app(Settings(**{**BASE_SETTINGS, "alert_interval_ms": 0, "relay": False}),
                     broker=broker, redis=redis)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        await http.post("/produce", json={"topic": "orders", "value": "v1"})
        await http.get("/message", params={"consumer": "c1", "topic": "orders"})
        # an old copy whose refresh another node is making right now (it holds the lease): the
        # view reads again once, and finds it fresh
        from gateway.store.keys import KeyLayout
        keys = KeyLayout("mqgw")
        await redis.hset(keys.watermarks("orders"), "ts", 1)
        await redis.set(keys.watermark_lease("orders"), "another-node", px=3)
        busy = (await http.get("/admin/backlog")).json()
        assert busy["stale"] is False and busy["watermarksAgeMs"] < 5_000, busy
        # a consumer of a topic since deleted: its last figures are final, not stale
        broker.create("gone", 1)
        await http.get("/message", params={"consumer": "c0", "topic": "gone"})
        del broker.logs["gone"]
        await asyncio.sleep(0.05)
        fresh = (await http.get("/admin/backlog")).json()
        assert fresh["stale"] is False and fresh["staleReason"] is None, fresh
        assert 0 <= fresh["watermarksAgeMs"] < 5_000

        async def down(topic: str) -> Any:
            raise BrokerUnavailable("Local: Broker transport failure")
        monkeypatch.setattr(broker, "watermarks", down)
        await asyncio.sleep(0.05)  # past two refresh intervals (5 ms each)
        r = await http.get("/admin/backlog")
        assert r.status_code == 200, r.text
        old = r.json()
        assert old["stale"] is True and "transport failure" in old["staleReason"]
        assert old["watermarksAgeMs"] >= 50
        by = {c["consumer"]: c for c in old["consumers"]}
        assert by["c1"]["totalBacklog"] == 1  # the last figures, still there
        # a pause during the outage is applied and shown (the registry lives in Redis)
        r = await http.post("/admin/consumers/c1/pause")
        assert r.status_code == 200, r.text
        after = (await http.get("/admin/backlog")).json()["consumers"]
        assert {c["consumer"]: c["paused"] for c in after}["c1"] is True
