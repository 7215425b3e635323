"""A produce request is bounded by ``produce_timeout_ms`` plus a slack, whatever inside it
hangs (core/produce.py ``within_produce_timeout``, issue 32).

Before: a delayed ``/produce`` during a broker outage answered 503 only after 143-216 s with
``produce_timeout_ms`` at 30 s: metadata waits, the delay wheel's topic checks and the sends ran
one after another, each with a timeout of its own. Here the broker's calls never return (the
memory broker with its queue look-up and its send held for ever), so without the bound each
request below hangs and ``fail_after`` fails the test; with it, each is a 503 at once. The
same on a real broker that stops answering: tests/system/test_broker_fenced.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import fakeredis
import httpx
import pytest

from gateway.api.app import create_app
from gateway.broker import OutgoingMessage
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core import produce as produce_module

from .conftest import BASE_SETTINGS

pytestmark = pytest.mark.anyio


class HangingBroker(MemoryBroker):
    """Answers nothing once :attr:`hang` is set: what a SIGSTOPped broker looks like to a
    client whose own timeouts are long."""

    hang = False

    async def queues(self, topic: str) -> list[str]:
        if self.hang:
            await asyncio.Event().wait()
        return await super().queues(topic)

    async def produce(self, topic: str, messages: Sequence[OutgoingMessage], *a: Any, **kw: Any) -> Any:
        if self.hang:
            await asyncio.Event().wait()
        return await super().produce(topic, messages, *a, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("path,body,headers", [
    ("/produce", {"topic": "orders", "value": "now"}, {}),
    ("/produce", {"topic": "orders", "value": "later", "delayMs": 60_000}, {}),
    ("/topics/orders", {"records": [{"value": {"a": 1}}]},
     {"content-type": "application/vnd.kafka.json.v2+json"}),
])
async def test_a_produce_whose_broker_hangs_is_a_503_within_its_bound(
        redis: fakeredis.FakeAsyncRedis, monkeypatch: pytest.MonkeyPatch,
        path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    monkeypatch.setattr(produce_module, "PRODUCE_SLACK_S", 0.1)
    broker = HangingBroker()
    broker.create("orders", 2)
    app = create_app(Settings(**{**BASE_SETTINGS, "alert_interval_ms": 0, "relay": False,
                                 "produce_timeout_ms": 200}), broker=broker, redis=redis)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    async with app.router.lifespan_context(app), http:
        r = await http.post(path, json=body, headers=headers)
        assert r.status_code == 200, r.text  # served while the broker answers
        broker.hang = True
        with anyio.fail_after(10):  # the bound is 0.3 s; unbounded, this never returns
            r = await http.post(path, json=body, headers=headers)
        broker.hang = False
    assert r.status_code == 503, r.text
    assert "unavailable" in r.text, r.text
