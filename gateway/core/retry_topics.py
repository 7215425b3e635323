"""Which consumers' retry topics a poll should look at: found by listing, remembered when idle.

A consumer's retry topic (core/retry.py) exists only once it failed a record, and most never do.
Asking the broker per poll whether it exists would multiply metadata requests by the request
rate, and running choose on an empty retry topic would double every poll's Redis calls. So:

- **Discovery.** Existence comes from a listing of every topic under the retry prefix
  (:meth:`~.watermarks.Watermarks.exists`: one metadata call per process every few seconds,
  for any number of consumers). A poll waiting without its retry topic is remembered here, and
  while any wait, the listing is repeated (a long poll makes no request of its own meanwhile);
  a listing that finds one wakes its polls, which then wait watching it.
- **Idle memo.** When choose found nothing to retry, the topic's watermark version is noted;
  until its records change, polls pass it by without a Redis call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..broker import BrokerUnavailable, UnknownTopic
from .waiting import Key
from .watermarks import LIST_EVERY_S, Watermarks

#: Entries a per-process memo keeps before it starts over (a memo saves Redis calls; losing it
#: costs one call per key, so clearing beats tracking age).
MEMO_MAX = 100_000


class RetryTopics:
    def __init__(self, watermarks: Watermarks, prefix: str, wake: Callable[[Key], object]) -> None:
        self.wm = watermarks
        self.prefix = prefix
        #: Wakes one waiting poll of a key (the consume service's WaitRoom).
        self._wake = wake
        #: Per (retry topic, consumer, clientId): the watermark version at which choose found
        #: nothing to retry.
        self._idle: dict[tuple[str, str, str], int] = {}
        #: Retry topics not known to exist -> the keys of polls waiting without them.
        self._missing: dict[str, set[Key]] = {}
        self._lister: asyncio.Future[None] | None = None
        watermarks.on_new_topics = self._found

    async def serve(self, retry: str, consumer: str, client_id: str) -> bool | None:
        """Whether this poll should look at the consumer's retry topic (None: there is none): it
        exists, and was not found with nothing to retry since its records last changed. A
        consumer that never failed a record pays no Redis call for it, and one with nothing to
        retry pays one per new retried record."""
        try:
            if not await self.wm.exists(retry, self.prefix):
                return None
            idle = self._idle.get((retry, consumer, client_id))
            if idle is None:
                return True
            await self.wm.get(retry)  # cached; refreshed in the background when stale
        except (UnknownTopic, BrokerUnavailable):
            return None  # deleted meanwhile, or the broker is down: the topic itself decides
        if idle == self.wm.version(retry):
            return False
        self._idle.pop((retry, consumer, client_id), None)
        return True

    def idle(self, retry: str, consumer: str, client_id: str, version: int) -> None:
        """Choose found nothing to retry there: pass it by until its records change.
        ``version``: the watermarks' version choose decided on (not the current one: a refresh
        that landed since then may hold the record it did not see)."""
        if len(self._idle) >= MEMO_MAX:  # broadcast clientIds come and go
            self._idle.clear()
        self._idle[(retry, consumer, client_id)] = version

    def waiting_without(self, retry: str, key: Key) -> None:
        """A poll of ``key`` waits, and ``retry`` is not known to exist: wake it if a listing
        finds it (listing every LIST_EVERY_S while any such poll waits)."""
        self._missing.setdefault(retry, set()).add(key)
        if self._lister is None or self._lister.done():
            self._lister = asyncio.ensure_future(self._list_while_waiting())

    def done_waiting(self, retry: str, key: Key) -> None:
        keys = self._missing.get(retry)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._missing[retry]

    def made(self, retry: str) -> None:
        """This process just made (or wrote to) ``retry``: serve it from now on."""
        self.wm.created(retry)

    async def _list_while_waiting(self) -> None:
        """Only requests trigger a listing otherwise, and a long poll makes none while it waits."""
        while self._missing:
            await asyncio.sleep(LIST_EVERY_S)
            try:
                await self.wm.exists(self.prefix, self.prefix)  # refreshes a stale listing
            except BrokerUnavailable:
                pass  # the next round tries again

    def _found(self, topics: set[str]) -> None:
        """A listing found new retry topics: polls waiting without them look again (and then
        wait watching them)."""
        for topic in topics:
            for key in list(self._missing.get(topic, ())):
                self._wake(key)
