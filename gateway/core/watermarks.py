"""Broker watermarks (low/high offset per queue) shared by all nodes through Redis.

Asking the broker on every ``/message`` would multiply ListOffsets by the request
rate. Instead each topic's watermarks sit in Redis and are refreshed at most once
per ``refresh_ms`` by whichever node takes the refresh lease; every process keeps
the last copy it read for the same interval, and raises the high watermark
whenever a fetch response shows a higher one. The copy is only a cache: losing it
(a node dying) loses nothing. Views that read many topics once (the backlog) use
:meth:`Watermarks.shared`: the same lease and refresh, without the process cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from ..broker import Broker, UnknownTopic, check_queue_id
from ..config import node_id
from ..store import OffsetStore, now_ms
from ..store.marks import MarkLog, SharedCopy

log = logging.getLogger("mqgw.watermarks")

#: A copy older than refresh_ms is still served (and refreshed in the background) for up to this
#: many intervals; only an older or missing copy makes a request wait for the refresh.
_STALE_INTERVALS = 10
#: Listings of topics by prefix (:meth:`Watermarks.exists`) are this old at most: a consumer's
#: first retry can reach a poll on another node this late (5 s made the first retry of
#: tests/system/test_retry.py up to 1.2 s late, polls landing on either of two nodes). One metadata
#: request per process per interval, answered in the background.
LIST_EVERY_S = 1.0



class Stamped(NamedTuple):
    """A topic's shared watermarks as a view reads them: ``written_ms``, when a node last read
    them from the broker (0: never, or the topic is gone: its last figures are final);
    ``problem``, why this read could not (the broker's error), or ''."""

    queues: dict[str, tuple[int, int]]
    written_ms: int
    problem: str

@dataclass(slots=True)
class _Entry:
    read_at: float = 0.0  # monotonic seconds
    #: the copy, and which queues each change moved (choose.lua gets only those: store/marks.py)
    marks: MarkLog = field(default_factory=MarkLog)
    #: the shared copy in Redis as last read: the next read gets only what moved since
    shared: SharedCopy | None = None
    inflight: asyncio.Future[None] | None = None  # the running refresh, if any

    @property
    def queues(self) -> dict[str, tuple[int, int]]:
        return self.marks.queues

    @property
    def version(self) -> int:
        """Grows whenever any high watermark moves: wakes long-polls."""
        return self.marks.version


class Watermarks:
    def __init__(self, store: OffsetStore, broker: Broker, refresh_ms: int) -> None:
        self.store = store
        self.broker = broker
        self.refresh_s = refresh_ms / 1000
        self.refresh_ms = refresh_ms
        self.node_id = node_id()
        self._topics: dict[str, _Entry] = {}
        self._unknown: dict[str, float] = {}
        self._listed: dict[str, tuple[float, set[str]]] = {}  # prefix -> (when, topic names)
        self._listing: dict[str, asyncio.Future[None]] = {}
        #: Told of topics a listing found (or :meth:`created` added) since the one before.
        self.on_new_topics: Callable[[set[str]], None] | None = None

    def created(self, topic: str) -> None:
        """``topic`` was just made: forget that it was unknown a moment ago."""
        self._unknown.pop(topic, None)
        for prefix, (_at, names) in self._listed.items():
            if topic.startswith(prefix) and topic not in names:
                names.add(topic)
                if self.on_new_topics is not None:
                    self.on_new_topics({topic})

    async def exists(self, topic: str, prefix: str) -> bool:
        """Whether ``topic`` exists, from a listing of every topic starting with ``prefix``
        made at most every :data:`LIST_EVERY_S` (in the background once there is one): one
        metadata call per process for any number of consumers' retry topics, instead of one
        per consumer (measured: 50 consumers made 50 calls per interval)."""
        listed = self._listed.get(prefix)
        if listed is None or time.monotonic() - listed[0] >= LIST_EVERY_S:
            task = self._listing.get(prefix)
            if task is None or task.done():
                task = self._listing[prefix] = asyncio.ensure_future(self._list(prefix))
                task.add_done_callback(_log_failure)
            if listed is None:
                await asyncio.shield(task)
                listed = self._listed[prefix]
        return topic in listed[1]

    async def _list(self, prefix: str) -> None:
        names = await self.broker.topics(prefix)
        old = self._listed.get(prefix)
        self._listed[prefix] = (time.monotonic(), names)
        if old is not None and self.on_new_topics is not None and names - old[1]:
            self.on_new_topics(names - old[1])

    def cached(self, topic: str) -> dict[str, tuple[int, int]]:
        """The watermarks this process holds for ``topic`` now, with no I/O ({} if none)."""
        e = self._topics.get(topic)
        return e.queues if e else {}

    def version(self, topic: str) -> int:
        e = self._topics.get(topic)
        return e.version if e else 0

    def marks(self, topic: str) -> MarkLog | None:
        """This process's copy of ``topic``'s watermarks with its history (None before the first
        :meth:`get`): what :meth:`.OffsetStore.choose` sends only the changes of."""
        e = self._topics.get(topic)
        return e.marks if e is not None else None

    async def get(self, topic: str) -> dict[str, tuple[int, int]]:
        """Watermarks of ``topic``; raises :class:`UnknownTopic`.

        A copy younger than ``refresh_ms`` is served as is. An older one is still served while
        one background task refreshes it (it is only a hint: stored max offsets never go down
        and fetches raise them), so no request waits on ListOffsets; only a missing or very old
        copy makes the request wait for the refresh.
        """
        e = self._topics.get(topic)
        if e is not None and e.queues:
            age = time.monotonic() - e.read_at
            if age < self.refresh_s:
                return e.queues
            if age < _STALE_INTERVALS * self.refresh_s:
                self._refresh_once(topic, e)
                return e.queues
        if time.monotonic() < self._unknown.get(topic, 0):
            raise UnknownTopic(topic)
        if e is None:
            e = self._topics[topic] = _Entry()
        await asyncio.shield(self._refresh_once(topic, e))
        return e.queues

    def _refresh_once(self, topic: str, e: _Entry) -> asyncio.Future[None]:
        """Start a refresh unless one is running (single flight per process); return it."""
        if e.inflight is None:
            e.inflight = asyncio.ensure_future(self._refresh_and_clear(topic, e))
            e.inflight.add_done_callback(_log_failure)
        return e.inflight

    async def _refresh_and_clear(self, topic: str, e: _Entry) -> None:
        try:
            await self._refresh(topic, e)
        finally:
            e.inflight = None

    async def _refresh(self, topic: str, e: _Entry) -> None:
        try:
            e.shared, _ = await self._read_shared(topic, strict=True, have=e.shared)
        except UnknownTopic:
            self._unknown[topic] = time.monotonic() + 1.0
            self._topics.pop(topic, None)
            raise
        self._merge(e, e.shared.queues)
        e.read_at = time.monotonic()

    async def shared(self, topic: str) -> Stamped:
        """The topic's shared watermarks, refreshed from the broker first if they are stale and
        this process wins the refresh lease (as the consume path refreshes them), without the
        process cache: for views that read each topic once. An unknown or unreachable topic is
        logged and answers the stored copy (possibly empty): stored offsets still count, and
        the answer says when the copy was last read from the broker, and why not since."""
        problems: list[str] = []
        copy, ts = await self._read_shared(topic, strict=False, problems=problems)
        if ts and not problems and now_ms() - ts > 2 * self.refresh_ms:
            # Old, and no error of ours: another node holds the refresh lease and is reading
            # the broker right now (a topic nobody polls is refreshed by whoever views it
            # first). Its answer lands within moments when the broker answers: read again
            # once, or the view calls healthy figures stale (CI's console test, 2 runs in 3).
            await asyncio.sleep(min(self.refresh_ms, 500) / 1000)
            copy, ts = await self._read_shared(topic, strict=False, problems=problems)
        return Stamped(copy.queues, ts, problems[0] if problems else "")

    async def _read_shared(self, topic: str, strict: bool, have: SharedCopy | None = None,
                           problems: list[str] | None = None) -> tuple[SharedCopy, int]:
        """Read the shared copy (only what moved since ``have``), taking the refresh lease if it
        is stale; with the lease (or no copy at all) ask the broker and store what it says
        (watermarks only move forward). ``strict``: broker errors are raised, else logged and
        the stored copy returned."""
        lease, copy, ts = await self.store.read_watermarks(topic, self.refresh_ms, self.node_id,
                                                           have)
        wm = copy.queues
        if lease or not wm:
            try:
                fresh = await self.broker.watermarks(topic)
                for q in fresh:  # an adapter's ids end up in Redis fields and comma lists
                    check_queue_id(q)
                written = await self.store.write_watermarks(topic, fresh, copy)
            except Exception as e:
                if strict:
                    raise
                log.info("watermarks of %s unavailable: %r", topic, e)
                if isinstance(e, UnknownTopic):  # deleted: its last figures are final, not stale
                    return copy, 0
                if problems is not None:
                    problems.append(f"{type(e).__name__}: {e}"[:200])
                return copy, ts
            copy, ts = written, now_ms()
        return copy, ts

    def observe(self, topic: str, queue: str, high_watermark: int) -> None:
        """Raise a queue's high watermark from a fetch response (ListOffsets may lag behind)."""
        e = self._topics.get(topic)
        if e is None or high_watermark < 0:
            return
        lo, hi = e.queues.get(queue, (0, 0))
        if high_watermark > hi:
            if queue in e.queues:
                e.marks.raise_one(queue, (lo, high_watermark))
            else:  # a queue the copy did not list yet: a new copy
                e.marks.update({**e.queues, queue: (lo, high_watermark)}, (queue,))

    @staticmethod
    def _merge(e: _Entry, wm: dict[str, tuple[int, int]]) -> None:
        merged: dict[str, tuple[int, int]] = {}
        changed: list[str] = []
        old = e.queues
        for q, (lo, hi) in wm.items():
            olo, ohi = old.get(q, (-1, -1))
            merged[q] = (max(lo, olo), max(hi, ohi))
            if merged[q][1] != ohi:  # new, or its high watermark moved
                changed.append(q)
        if set(old) - set(wm):  # a queue gone: no change to send, but long-polls look again
            changed.append(next(iter(set(old) - set(wm))))
        e.marks.update(merged, changed)


def _log_failure(fut: asyncio.Future[None]) -> None:
    """Background refreshes have no awaiting request; their failure is logged, and retried."""
    # An unknown topic is the answer of the request that asked (404), or a consumer's retry
    # topic that was never needed: not a failure.
    if not fut.cancelled() and fut.exception() is not None \
            and not isinstance(fut.exception(), UnknownTopic):
        log.warning("watermark refresh failed: %s", fut.exception())
