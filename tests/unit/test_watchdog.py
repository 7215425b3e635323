"""The slow-stop watchdog (gateway/ops/watchdog.py): silent for a quick body, a report of every
thread's and task's stack for a slow one. No durations are asserted: the slow body waits until
the report came (bounded); after the quick one, its watching thread has ended, unreported."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.ops import watchdog

pytestmark = pytest.mark.anyio


async def test_a_slow_body_is_reported_with_where_it_waits() -> None:
    reported = threading.Event()
    texts: list[str] = []

    def got(text: str) -> None:
        texts.append(text)
        reported.set()

    async def stuck_in_here() -> None:
        await asyncio.to_thread(reported.wait, 30)

    with watchdog.report_if_slow("unit stop", after_s=0.05, on_report=got):
        await asyncio.wait_for(asyncio.create_task(stuck_in_here(), name="stuck"), 30)
    assert len(texts) == 1
    assert "thread MainThread" in texts[0] and "stuck_in_here" in texts[0]  # the task's await


async def test_a_quick_body_is_not_reported() -> None:
    texts: list[str] = []
    with watchdog.report_if_slow("unit stop", after_s=2, on_report=texts.append):
        await asyncio.sleep(0)
    for _ in range(3000):  # its thread ends as the body does (else it would report in 2 s)
        if not any(t.name == "mqgw-slow-stop" for t in threading.enumerate()):
            break
        await asyncio.sleep(0.01)
    assert texts == [] and not any(t.name == "mqgw-slow-stop" for t in threading.enumerate())
