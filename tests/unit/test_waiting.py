"""The wait room (core/waiting.py): which long polls a change wakes, and when."""

from __future__ import annotations

import asyncio

import pytest

from gateway.core.waiting import WaitRoom

pytestmark = pytest.mark.anyio

KEY = ("orders", "c1", "")


def room(log: dict[str, int], seen: dict[str, int]) -> WaitRoom:
    async def highs(topic: str) -> dict[str, int]:
        return dict(log)
    return WaitRoom(highs, 0.001, 5.0, lambda topic: dict(seen))


async def test_records_that_landed_before_the_watcher_first_looked_still_wake_the_poll() -> None:
    """A poll chose on the cached highs (5) while its stale read started a refresh; the refresh
    landed (6) before the new watcher's first read. Taking that read as the baseline hid the new
    record until the re-check (5 s when idle): the poll answered empty with a record waiting."""
    log = {"0": 6}
    assert await room(log, seen={"0": 5}).wait(KEY, timeout_s=2.0, recheck_s=5.0)


async def test_a_poll_waits_while_nothing_moves_and_wakes_when_a_queue_does() -> None:
    log = {"0": 5, "1": 3}
    r = room(log, seen=dict(log))
    assert not await r.wait(KEY, timeout_s=0.05, recheck_s=5.0)
    waiters = [asyncio.ensure_future(r.wait(KEY, timeout_s=2.0, recheck_s=5.0)) for _ in range(3)]
    await asyncio.sleep(0.01)
    log["1"] = 4  # one queue moved: one poll can take it
    await asyncio.sleep(0.05)
    assert [w.done() for w in waiters] == [True, False, False]  # the oldest
    assert r.wake(KEY, 5) == 2  # a local ack wakes the rest
    assert all(await asyncio.gather(*waiters))
