"""Where long polls that found nothing wait, in one process, so that a crowd costs what the work
costs and not what the crowd is.

Polls that each wake on their own (every ``refresh`` interval to look at the watermarks, every
second or five to re-run choose in Redis, and all at once whenever a high watermark moves) cost
what the crowd is: 10,000 polls waiting on one topic would run 10,000 choose scripts per new
record, for at most one queue each to take (BENCHMARKS.md, issue 10: 2,440 scripts for one
record under 1,200 polls that way, ~20 with this module).

So the waiters of one *key* (topic, consumer, clientId: the polls that compete for the same
queues) queue up here, oldest first, and are woken in small numbers:

- **New records**: one watcher per topic (not per poll) reads the process's cached watermarks
  every refresh interval and, when high watermarks move, wakes as many waiters of each of the
  topic's keys as queues moved: a queue can feed one poll at a time.
- **Baton**: a woken poll that got a batch wakes the next one of its key, since there may be
  more work than was counted (a backlog bigger than one batch on a queue this node just freed,
  a second queue); a poll that found nothing goes back to wait and wakes nobody. So the wakes
  are the work plus one.
- **Re-check**: only the oldest waiter of a key re-runs choose on a timer, for what no
  watermark shows: a lock expiring (its time is known: ``wake_ms``), an ack or unlock on
  another node, an offset reset, a resume.
- **Local ack or unlock** of a key's queue wakes one waiter at once (the queue may still hold
  a backlog): no need to wait for the re-check.

A waiter holds no Redis connection and no task of its own besides the request's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

#: The key waiters compete in: (topic, consumer, clientId).
Key = tuple[str, str, str]


@dataclass(slots=True)
class _Line:
    """The waiters of one key, oldest first, and the key's one re-check timer."""

    waiters: deque[asyncio.Future[bool]] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    due: float = 0.0  # loop time the timer fires at
    also: set[str] = field(default_factory=set)  # other topics watched for this key


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)  # timed out, not woken


class WaitRoom:
    def __init__(self, highs: Callable[[str], Awaitable[dict[str, int]]], tick_s: float,
                 fallback_s: float, seen: Callable[[str], dict[str, int]]) -> None:
        #: The topic's high watermark per queue, as this process sees it (cheap: a cached read).
        self._highs = highs
        #: The same, as the cache holds it right now, without any I/O: a new watcher's baseline
        #: (see _watch).
        self._seen = seen
        self._tick_s = tick_s
        #: After a timed re-check, the next one is due this long later at the latest, in case the
        #: poll it woke does not come back to re-arm it (it got a batch, or an error).
        self._fallback_s = fallback_s
        self._lines: dict[Key, _Line] = {}
        self._by_topic: dict[str, set[Key]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._draining = False

    def drain(self) -> None:
        """End every wait now, as if it had timed out, and every later one at once: the node is
        stopping, and a long poll answered empty is retried on another node (instead of being
        cut without an answer when the process exits)."""
        self._draining = True
        for line in self._lines.values():
            for fut in line.waiters:
                _expire(fut)

    async def wait(self, key: Key, timeout_s: float, recheck_s: float,
                   also: str | None = None) -> bool:
        """Wait until woken (True), or ``timeout_s`` passes (False). ``recheck_s``: when this poll
        wants to re-run choose even if nothing is seen to change (only the oldest waiter of a key
        gets to). ``also``: another topic whose new records wake the key's waiters (the
        consumer's retry topic)."""
        if self._draining:
            return False
        loop = asyncio.get_running_loop()
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line()
            self._by_topic.setdefault(key[0], set()).add(key)
        if also is not None and also not in line.also:
            line.also.add(also)
            self._by_topic.setdefault(also, set()).add(key)
        fut: asyncio.Future[bool] = loop.create_future()
        line.waiters.append(fut)
        self._arm(key, line, loop.time() + recheck_s)
        self._watch(key[0])
        if also is not None:
            self._watch(also)
        expiry = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        finally:
            expiry.cancel()
            if not fut.done():
                fut.cancel()
            self._leave(key, line, fut)

    def wake(self, key: Key, n: int = 1) -> int:
        """Wake up to ``n`` of the key's oldest waiters; how many were woken."""
        line = self._lines.get(key)
        woken = 0
        while line is not None and woken < n and line.waiters:
            fut = line.waiters.popleft()
            if not fut.done():
                fut.set_result(True)
                woken += 1
        return woken

    # -- internals ----------------------------------------------------------------------------
    def _leave(self, key: Key, line: _Line, fut: asyncio.Future[bool]) -> None:
        try:
            line.waiters.remove(fut)
        except ValueError:
            pass  # woken: already taken off the line
        if not line.waiters:
            if line.timer is not None:
                line.timer.cancel()
            if self._lines.get(key) is line:
                del self._lines[key]
                for topic in (key[0], *line.also):
                    keys = self._by_topic.get(topic)
                    if keys is not None:
                        keys.discard(key)
                        if not keys:
                            del self._by_topic[topic]

    def _arm(self, key: Key, line: _Line, at: float) -> None:
        """Make the key's re-check fire no later than ``at``."""
        if line.timer is not None and line.due <= at:
            return
        if line.timer is not None:
            line.timer.cancel()
        line.due = at
        line.timer = asyncio.get_running_loop().call_at(at, self._recheck, key, line)

    def _recheck(self, key: Key, line: _Line) -> None:
        line.timer = None
        self.wake(key, 1)  # the oldest re-checks, and re-arms the timer sooner if it waits again
        if line.waiters:
            self._arm(key, line, asyncio.get_running_loop().time() + self._fallback_s)

    def _watch(self, topic: str) -> None:
        running = self._watchers.get(topic)
        if running is None or running.done():  # done: it saw no waiter left, and its callback
            # has not run yet. The baseline is what the waiting poll looked at, taken now: a
            # refresh that lands before the watcher's first read (it was started by that poll's
            # own stale read) moved the highs past what the poll chose on, and a baseline read
            # then would hide it until the re-check (5 s when idle).
            task = asyncio.ensure_future(self._watcher(topic, dict(self._seen(topic))))
            self._watchers[topic] = task
            task.add_done_callback(lambda t: self._forget(topic, t))

    def _forget(self, topic: str, task: asyncio.Task[None]) -> None:
        if self._watchers.get(topic) is task:  # not a newer watcher of the same topic
            del self._watchers[topic]

    async def _watcher(self, topic: str, last: dict[str, int]) -> None:
        """While polls wait on ``topic``: wake as many per key as queues got new records since
        ``last`` (the highs they chose on)."""
        while topic in self._by_topic:
            try:
                highs = await self._highs(topic)
            except Exception:  # noqa: BLE001 - unknown topic, broker or Redis down: polls time out
                highs = last
            moved = sum(1 for q, hi in highs.items() if hi > last.get(q, 0))
            if moved:
                for key in list(self._by_topic.get(topic, ())):
                    self.wake(key, moved)
            last = dict(highs)
            await asyncio.sleep(self._tick_s)
