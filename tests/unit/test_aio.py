"""gateway/aio.py: cancellations are not lost in ``asyncio.wait_for`` (Python 3.11's defect,
CPython gh-86296), and :func:`stop_tasks` ends a task that ignores its cancels. The real-Redis
side (a task cancelled inside store calls thousands of times) is tests/system/test_cancellation.py."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from gateway import aio

pytestmark = pytest.mark.anyio


async def _cancel_as_the_future_completes(wait_for: object) -> asyncio.Task[int]:
    """A task in ``wait_for(fut)``; ``fut`` gets its result and the task its cancel in the
    same loop turn (what happens when Redis answers just as a stop cancels the task)."""
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def waiter() -> int:
        return await wait_for(fut, 10)  # type: ignore[operator, no-any-return]

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the task waits on fut
    fut.set_result(1)
    task.cancel()
    await asyncio.wait([task], timeout=5)
    return task


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the defect is 3.11's (fixed in 3.12)")
async def test_python_311_wait_for_loses_the_cancel() -> None:
    """The defect itself, so that the next test is known to test something."""
    task = await _cancel_as_the_future_completes(aio.ORIGINAL_WAIT_FOR)
    assert task.done() and not task.cancelled() and task.result() == 1


async def test_wait_for_keeps_a_cancel_that_arrives_as_the_future_completes() -> None:
    assert asyncio.wait_for is asyncio.tasks.wait_for
    task = await _cancel_as_the_future_completes(asyncio.wait_for)
    assert task.cancelled()


async def test_wait_for_still_times_out_and_returns() -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.sleep(5), 0.01)
    assert await asyncio.wait_for(asyncio.sleep(0, result=7), 5) == 7
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.sleep(5), 0)
    assert await asyncio.wait_for(asyncio.sleep(0, result=8), None) == 8


async def test_stop_tasks_ends_a_task_that_swallows_its_cancels(caplog: pytest.LogCaptureFixture) -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed >= 3:
                    raise

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, "mqgw.tasks"):
        await asyncio.wait_for(aio.stop_tasks([task, None], warn_after_s=0.05), 10)
    assert task.cancelled() and swallowed == 3
    # past the bound, one warning that names the task, its pending cancel and where it waits
    text = caplog.text
    assert "still running" in text and "task stubborn (cancel requested" in text
    assert "stubborn" in text and "test_aio.py" in text


async def test_stop_tasks_logs_what_a_task_ended_with(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails(), name="fails")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, "mqgw.tasks"):
        await aio.stop_task(task)
    assert "fails ended with RuntimeError('boom')" in caplog.text


async def test_await_chain_walks_into_async_generators() -> None:
    gate = asyncio.Event()

    async def gen():  # type: ignore[no-untyped-def]
        await gate.wait()
        yield 1

    async def consumer() -> None:
        async for _ in gen():
            pass

    task = asyncio.create_task(consumer())
    await asyncio.sleep(0)
    chain = aio.await_chain(task.get_coro())
    assert [line.rsplit(" ", 1)[1] for line in chain[:3]] == ["consumer", "gen", "wait"]
    gate.set()
    await task


async def test_a_produce_request_is_bounded_by_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """core/produce.py: a request that outlives produce_timeout_ms (+ slack) is a 503, and a
    TimeoutError of its own is not taken for the bound's."""
    from gateway.broker import BrokerUnavailable
    from gateway.core import produce

    monkeypatch.setattr(produce, "PRODUCE_SLACK_S", 0.0)
    with pytest.raises(BrokerUnavailable, match="did not acknowledge"):
        await produce.within_produce_timeout(asyncio.sleep(30), 10)

    async def own_timeout() -> None:
        raise TimeoutError("not the bound's")
    with pytest.raises(TimeoutError, match="not the bound's"):
        await produce.within_produce_timeout(own_timeout(), 10_000)
    assert await produce.within_produce_timeout(asyncio.sleep(0, result=3), 10_000) == 3
