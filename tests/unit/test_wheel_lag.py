"""The delay wheel's built-in alert (ops/wheel_lag.py, ops/alerts.py): with no relay running
anywhere, delayed records wait in the level topics and nothing said so (a console test's retries
never came: its nodes run without a relay). The relay consumer's alert fires once a level
queue's head is ``delay_overdue_alert_ms`` past its time, and resolves once a relay moved it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import fakeredis
import pytest

from gateway.broker import OutgoingMessage
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.services import close_services, open_services

from .conftest import BASE_SETTINGS

pytestmark = pytest.mark.anyio
T = "orders"
WHEEL: dict[str, Any] = {**BASE_SETTINGS, "delay_levels": "100ms,1s", "delay_topic_prefix": "d.",
                         "alert_interval_ms": 0, "delay_overdue_alert_ms": 1}


async def test_the_wheel_alert_fires_while_no_relay_moves_its_records_and_resolves_after(
        redis: fakeredis.FakeAsyncRedis, broker: MemoryBroker) -> None:
    broker.create(T, 1)
    s = await open_services(Settings(**{**WHEEL, "relay": False}), broker=broker, redis=redis)
    try:
        await s.alerts.evaluate_now()  # no level topic yet (a relay-less node makes none at
        assert (await s.alerts.view(include_all=True))["all"] == []  # start): no wheel, no alert
        due = int(time.time() * 1000) + 150  # into the 100 ms level, due there 100 ms on
        await s.delay.produce(T, [OutgoingMessage(b"late", None, [])], [due])
        await asyncio.sleep(0.3)  # past its time at the level (lateness only grows)
        await s.alerts.evaluate_now()
        (state,) = (await s.alerts.view())["alerts"]
        assert state["consumer"] == "_mqgw.relay" and state["reasons"] == ["overdue"], state
        assert state["thresholds"] == {"overdueMs": 1} and state["totalBacklog"] == 1, state
        assert state["oldestAgeMs"] >= 100, state
        relay = await open_services(Settings(**{**WHEEL, "relay": True}), broker=broker,
                                    redis=redis, serve=False)  # as `mqgw relay` runs it
        try:
            for _ in range(1000):  # delivered in ~0.1 s
                if any(broker.logs[T].values()):
                    break
                await asyncio.sleep(0.01)
        finally:
            await close_services(relay)
        assert any(broker.logs[T].values())
        await s.alerts.evaluate_now()
        view = await s.alerts.view(include_all=True)
        assert view["alerts"] == [], view
        (state,) = view["all"]
        assert state["consumer"] == "_mqgw.relay" and state["state"] == "ok", state
        assert state["totalBacklog"] == 0 and state["oldestAgeMs"] == 0, state
    finally:
        await close_services(s)


async def test_off_with_a_zero_threshold(redis: fakeredis.FakeAsyncRedis,
                                         broker: MemoryBroker) -> None:
    broker.create(T, 1)
    s = await open_services(Settings(**{**WHEEL, "relay": False, "delay_overdue_alert_ms": 0}),
                            broker=broker, redis=redis)
    try:
        await s.delay.produce(T, [OutgoingMessage(b"late", None, [])],
                              [int(time.time() * 1000) + 150])
        await asyncio.sleep(0.3)
        await s.alerts.evaluate_now()
        assert (await s.alerts.view(include_all=True))["all"] == []
    finally:
        await close_services(s)
