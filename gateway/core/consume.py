"""Fetch, ack and unlock: the consume path. It returns typed results and raises domain errors;
the HTTP layer turns those into bodies and statuses, and the broker adapter owns its offsets.

``/message`` = (optional piggy-backed ack) -> choose+lock one queue in Redis -> read at the
committed offset -> hand out the records with a signed requestId. A long poll that finds
nothing waits in the process's :class:`~.waiting.WaitRoom`, which wakes waiters in numbers that
match the work (new records, a freed queue, a lock expiring), so a waiting poll costs no Redis
call and a crowd of them costs what one costs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

from ..broker import Broker, BrokerUnavailable, Record, Skipped, UnknownTopic
from ..config import Settings
from ..store import (
    AckOutcome,
    AckResult,
    Credential,
    Lock,
    NeedsRestore,
    NoQueue,
    OffsetStore,
    Paused,
    RateLimited,
    Refused,
    UnlockOutcome,
    UnlockResult,
    now_ms,
)
from .auth import Authorizer
from .checkpoint import Checkpoints
from .errors import DomainError, Forbidden, Invalid, bad_request
from .registry_copy import RegistryCopy
from .requestid import BatchRef, RequestIdCodec
from .retry import retry_topic
from .waiting import Key, WaitRoom
from .watermarks import LIST_EVERY_S, Watermarks

#: While long-polling with a backlog held under other consumers' locks, re-run choose this
#: often: an ack or early unlock on another node frees the queue without any other signal.
RECHECK_S = 1.0
#: With no backlog anywhere only new records (seen as a watermark change, no Redis call per
#: waiter) or an offset reset create work, so a slow re-check is enough.
IDLE_RECHECK_S = 5.0
#: Each process re-announces the consumers it serves (for the all-consumer views) this often.
SEEN_EVERY_MS = 60_000
#: Entries a per-process memo keeps before it starts over (a memo saves Redis calls; losing it
#: costs one call per key, so clearing beats tracking age).
MEMO_MAX = 100_000

_REFUSED: dict[str, tuple[type[DomainError], str]] = {
    "unregistered": (Forbidden, "consumer {g!r} is not registered "
                     "(PUT /admin/consumers/{g}, or run the gateway in open mode)"),
    "topic_not_allowed": (Forbidden, "consumer {g!r} is not registered for topic {t!r}"),
    "client_id_required": (Invalid, "consumer {g!r} is registered in broadcast "
                           "mode: every request needs a clientId"),
    "client_id_not_allowed": (Invalid, "consumer {g!r} is registered in "
                              "cluster mode: a clientId is not allowed"),
}
_UNREGISTERED_CODE = {"unregistered": "unregistered_consumer"}


class FetchStatus(str, Enum):
    OK = "ok"  # a batch was locked and read
    EMPTY = "empty"  # nothing to read before the wait ran out
    PAUSED = "paused"  # an operator paused the consumer
    RATE_LIMITED = "rate_limited"  # over the consumer's rate limit: retry after retry_after_ms


@dataclass(frozen=True, slots=True)
class FetchParams:
    group: str
    client_id: str
    topic: str
    max_messages: int
    wait_ms: int
    address: str
    ack_request_id: str = ""
    credential: Credential | None = None  # None: auth is off


@dataclass(frozen=True, slots=True)
class Batch:
    """Records read from one locked queue; ``request_id`` acks (or unlocks) them on any node."""

    request_id: str
    topic: str  # the asked topic, or the consumer's retry topic for it
    queue: str
    offset: int  # the committed offset the batch starts at
    next_offset: int  # the committed offset after a successful ack
    backlog: int  # records not yet committed in this queue, this batch included
    redelivered: bool  # an earlier holder's lock expired: these were handed out before
    lock_timeout_ms: int
    records: list[Record]
    skipped: Skipped | None = None  # offsets the broker stepped over before the first record


@dataclass(frozen=True, slots=True)
class Fetched:
    """The answer to one fetch (with the piggy-backed ack's result, if one was given)."""

    status: FetchStatus
    topic: str
    batch: Batch | None = None
    retry_after_ms: int = 0
    ack: AckResult | None = None

    @property
    def count(self) -> int:
        return len(self.batch.records) if self.batch else 0


@dataclass(slots=True)
class _Try:
    """What one /message request learned while it looked at queues."""

    p: FetchParams
    skip: set[tuple[str, str]] = field(default_factory=set)  # (topic, queue): nothing readable
    # queues this request took over from an expired lock: if the first read comes back empty
    # and the queue is taken again later in the request, its batch is still a redelivery
    taken_over: set[tuple[str, str]] = field(default_factory=set)
    announced: bool = False
    restored: int = 0
    copy_checked: bool = False  # the registry's copy was looked at (registry_copy.ensure)


class ConsumeService:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 watermarks: Watermarks, codec: RequestIdCodec, authorizer: Authorizer,
                 on_ack: Callable[[AckResult], None] | None = None,
                 checkpoints: Checkpoints | None = None,
                 registry_copy: RegistryCopy | None = None) -> None:
        self.settings = settings
        #: The registry's durable copy: a Redis that lost the registry gets it back before a
        #: refusal or a new queue's start position is decided on what is left.
        self.registry_copy = registry_copy
        #: Where offsets Redis lost are restored from (None: a consumer starts at ``start``).
        self.checkpoints = checkpoints
        #: Told of every ack the store decided, as soon as it is decided: a piggy-backed ack is
        #: committed even when the fetch after it fails (the HTTP layer counts them in metrics).
        self.on_ack = on_ack
        self.store = store
        self.broker = broker
        self.wm = watermarks
        self.codec = codec
        self.auth = authorizer
        self._seen: dict[str, int] = {}
        #: Per (retry topic, consumer, clientId): the watermark version at which choose found
        #: nothing to retry (see _serve_retry).
        self._retry_idle: dict[tuple[str, str, str], int] = {}
        self.room = WaitRoom(self._highs, watermarks.refresh_s, IDLE_RECHECK_S)
        #: Retry topics not known to exist -> the keys of polls waiting without them.
        self._no_retry: dict[str, set[Key]] = {}
        self._lister: asyncio.Future[None] | None = None
        watermarks.on_new_topics = self._retry_topics_found

    async def _highs(self, topic: str) -> dict[str, int]:
        return {q: hi for q, (_lo, hi) in (await self.wm.get(topic)).items()}

    # -- /message -------------------------------------------------------------------------
    async def fetch(self, p: FetchParams) -> Fetched:
        acked: AckResult | None = None
        retry = retry_topic(self.settings.retry_topic_prefix, p.group, p.topic, p.client_id)
        if p.ack_request_id:
            ref = self.decode(p.ack_request_id)
            if (ref.group, ref.client_id) != (p.group, p.client_id) or \
                    ref.topic not in (p.topic, retry):
                raise bad_request("request_id_mismatch",
                                  "requestId belongs to another consumer, clientId or topic")
            acked = await self.commit(ref, p.credential, wake=False)  # its sender chooses next
        loop = asyncio.get_running_loop()
        deadline = loop.time() + p.wait_ms / 1000
        t = _Try(p)
        key = (p.topic, p.group, p.client_id)
        waited = looked_again = False
        while True:
            version = self.wm.version(p.topic)
            targets = [p.topic]
            serve = await self._serve_retry(retry, p)
            if serve:
                targets.insert(0, retry)  # due retries first: they waited long enough
            nothing: list[NoQueue] = []
            for topic in targets:
                got = await self._try(t, topic)
                if isinstance(got, Fetched):
                    if got.batch is not None and waited:
                        # woken polls pass the baton: there may be more work than counted
                        self.room.wake(key)
                    return replace(got, ack=acked)
                if got is None:  # a queue came back empty or offsets were restored: again
                    break
                nothing.append(got)
                if topic == retry and got.wake_ms < 0:  # nothing to retry until records come
                    if len(self._retry_idle) >= MEMO_MAX:  # broadcast clientIds come and go
                        self._retry_idle.clear()
                    self._retry_idle[(retry, p.group, p.client_id)] = self.wm.version(retry)
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return Fetched(FetchStatus.EMPTY, p.topic, ack=acked)
                if self.wm.version(p.topic) != version and not looked_again:
                    looked_again = True  # records came during choose: look again, once
                else:
                    looked_again = False
                    wakes = [n.wake_ms for n in nothing if n.wake_ms >= 0]
                    if serve is None:  # woken if a listing finds the retry topic meanwhile
                        self._no_retry.setdefault(retry, set()).add(key)
                        self._list_while_waiting()
                    try:
                        woken = await self.room.wait(
                            key, remaining, self._recheck_s(NoQueue(min(wakes, default=-1)),
                                                            bool(t.skip)),
                            also=retry if serve is not None else None)
                    finally:
                        if serve is None:
                            self._forget_no_retry(retry, key)
                    if not woken:
                        # The wait ran out and nothing woke it: nothing came that it could take
                        # (new records, a freed queue and lock expiry all wake a waiter). No last
                        # choose: it would cost every idle poll a second script per cycle.
                        return Fetched(FetchStatus.EMPTY, p.topic, ack=acked)
                    waited = True
                t.skip.clear()

    async def _serve_retry(self, retry: str, p: FetchParams) -> bool | None:
        """Whether this poll should look at the consumer's retry topic (None: there is none): it
        exists (from a listing of the retry topics, one metadata call per process every few
        seconds), and was not found with nothing to retry since its records last changed. A
        consumer that never failed a record pays no Redis call for it, and one with nothing to
        retry pays one per new retried record."""
        try:
            if not await self.wm.exists(retry, self.settings.retry_topic_prefix):
                return None
            idle = self._retry_idle.get((retry, p.group, p.client_id))
            if idle is None:
                return True
            await self.wm.get(retry)  # cached; refreshed in the background when stale
        except (UnknownTopic, BrokerUnavailable):
            return None  # deleted meanwhile, or the broker is down: the topic itself decides
        if idle == self.wm.version(retry):
            return False
        self._retry_idle.pop((retry, p.group, p.client_id), None)
        return True

    def _forget_no_retry(self, retry: str, key: Key) -> None:
        keys = self._no_retry.get(retry)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._no_retry[retry]

    def _list_while_waiting(self) -> None:
        """While polls wait without their retry topic, list the retry topics every
        LIST_EVERY_S (a listing that finds one wakes its polls): only requests trigger a
        listing otherwise, and a long poll makes none while it waits."""
        if self._lister is None or self._lister.done():
            self._lister = asyncio.ensure_future(self._lister_loop())

    async def _lister_loop(self) -> None:
        prefix = self.settings.retry_topic_prefix
        while self._no_retry:
            await asyncio.sleep(LIST_EVERY_S)
            try:
                await self.wm.exists(prefix, prefix)  # refreshes a stale listing, in the background
            except BrokerUnavailable:
                pass  # the next round tries again

    def _retry_topics_found(self, topics: set[str]) -> None:
        """A listing found new retry topics: polls waiting without them look again (and then
        wait watching them)."""
        for topic in topics:
            for key in list(self._no_retry.get(topic, ())):
                self.room.wake(key)

    def retry_topic_made(self, retry: str) -> None:
        """This process just made (or wrote to) ``retry``: serve it from now on."""
        self.wm.created(retry)

    async def _try(self, t: _Try, topic: str) -> Fetched | NoQueue | None:
        """Choose, lock and read one queue of ``topic`` (the asked topic, or the consumer's retry
        topic for it): a final answer, NoQueue, or None to look again at once."""
        p = t.p
        try:
            wm = await self.wm.get(topic)
        except UnknownTopic:
            if topic != p.topic:  # the retry topic went away (deleted by an operator)
                return NoQueue(-1)
            await self.auth.require_consume(p.credential, p.group)  # 401/403 before 404
            raise
        chosen = await self.store.choose(
            p.group, p.client_id, topic, wm, address=p.address,
            default_timeout_ms=self.settings.consume_timeout_ms,
            default_start=self.settings.start_position,
            client_idle_ms=self.settings.client_idle_ms, max_messages=p.max_messages,
            open_mode=self.settings.open_mode, credential=p.credential,
            skip={q for tp, q in t.skip if tp == topic},
            restore=self.checkpoints is not None and self.checkpoints.enabled,
            registered_as=p.topic)
        if isinstance(chosen, (Refused, NeedsRestore)) and await self._registry_restored(t):
            return None  # decided on a Redis that had lost the registry: again with it
        if isinstance(chosen, Refused):
            raise await self._refused(chosen.reason, p)
        if isinstance(chosen, NeedsRestore):
            assert self.checkpoints is not None  # choose asks only when restores are on
            t.restored += 1
            if t.restored > 3:  # each restore seeds every queue of wm: only a Redis emptied
                raise BrokerUnavailable("offsets being restored")  # again and again gets here
            await self.checkpoints.restore(p.group, topic, chosen.start, wm)
            self._seen.pop(p.group, None)  # Redis lost the seen list too: announce again
            return None
        if not t.announced:  # only names choose.lua accepted (key, registration) are listed
            t.announced = True
            try:
                await self._announce(p.group)
            except BaseException:
                if isinstance(chosen, Lock):
                    await asyncio.shield(self._give_back(p, topic, chosen))
                raise
        if isinstance(chosen, Paused):  # answered at once, never long-polled
            return Fetched(FetchStatus.PAUSED, p.topic)
        if isinstance(chosen, RateLimited):
            return Fetched(FetchStatus.RATE_LIMITED, p.topic, retry_after_ms=chosen.retry_after_ms)
        if isinstance(chosen, Lock):
            if chosen.previous_lock_ms > 0:
                t.taken_over.add((topic, chosen.queue))
            batch = await self._pull(p, topic, chosen,
                                     redelivered=(topic, chosen.queue) in t.taken_over
                                     or chosen.committed < chosen.redeliver_below)
            if batch is not None:
                return Fetched(FetchStatus.OK, p.topic, batch=batch)
            t.skip.add((topic, chosen.queue))  # nothing readable there now: try the others first
            return None
        return chosen

    async def _refused(self, reason: str, p: FetchParams) -> DomainError:
        if reason == "unauthorized":
            return await self.auth.consume_refused(p.credential, p.group)
        kind, text = _REFUSED[reason]
        return kind(_UNREGISTERED_CODE.get(reason, reason), text.format(g=p.group, t=p.topic))

    async def _announce(self, group: str) -> None:
        """List the consumer among those seen (once a minute per process) for the views."""
        now = now_ms()
        if now - self._seen.get(group, 0) >= SEEN_EVERY_MS:
            if len(self._seen) >= MEMO_MAX:  # a memo, not a registry: start over rather than grow
                self._seen.clear()
            self._seen[group] = now
            await self.store.mark_seen(group)

    def _recheck_s(self, none: NoQueue, skipped: bool) -> float:
        """When a poll that found nothing should re-run choose unprompted (see waiting.py).
        ``skipped``: it passed over queues whose read came back empty although they hold a
        backlog (a slow broker, a tail race); nothing will signal them, so look again soon."""
        if none.wake_ms >= 0:  # a lock over a backlog expires then (or is freed sooner elsewhere)
            return min(RECHECK_S, max(0.0, (none.wake_ms - now_ms()) / 1000) + 0.002)
        return RECHECK_S if skipped else IDLE_RECHECK_S

    async def _give_back(self, p: FetchParams, topic: str, lock: Lock) -> None:
        await self.store.unlock(p.group, p.client_id, topic, lock.queue, lock.token)
        if lock.charged:
            await self.store.refund(p.group, lock.allowance)

    async def _registry_restored(self, t: _Try) -> bool:
        """Once per request, before a refusal or a new queue's start position: whether Redis had
        lost the registry and it was just restored (then choose again)."""
        if self.registry_copy is None or t.copy_checked:
            return False
        t.copy_checked = True
        return await self.registry_copy.ensure()

    async def _pull(self, p: FetchParams, topic: str, lock: Lock, redelivered: bool) -> Batch | None:
        """Read the locked queue; None (with the lock released or the skip committed) if empty."""
        start = lock.committed
        fetched = now_ms()
        try:
            res = await self.broker.fetch(topic, lock.queue, start, lock.allowance)
        except BaseException:
            # The broker failed (or the client went away): free the queue for the next fetch now
            # rather than after the consume timeout, and give back the rate-limit tokens charged
            # for records nobody received (a broker blip must not turn into 429s afterwards).
            await asyncio.shield(self._give_back(p, topic, lock))
            raise
        self.wm.observe(topic, lock.queue, res.high_watermark)
        if lock.charged and len(res.records) < lock.allowance:  # rare: a read came back short
            await self.store.refund(p.group, lock.allowance - len(res.records))
        if not res.records:
            if res.next_offset > start:  # nothing readable past a skip: move past it ourselves
                await self.store.ack(p.group, p.client_id, topic, lock.queue, start,
                                     res.next_offset, lock.token,
                                     default_timeout_ms=self.settings.consume_timeout_ms,
                                     high_watermark=res.high_watermark)
            else:
                await self.store.unlock(p.group, p.client_id, topic, lock.queue, lock.token,
                                        res.high_watermark)
            return None
        ref = BatchRef(self.broker.name, p.group, p.client_id, topic, lock.queue, start,
                       res.next_offset, lock.token, res.high_watermark, fetched)
        return Batch(
            request_id=self.codec.encode(ref), topic=topic, queue=lock.queue, offset=start,
            next_offset=res.next_offset,
            backlog=max(lock.max_offset, res.high_watermark) - start,
            redelivered=redelivered, lock_timeout_ms=lock.timeout_ms, records=res.records,
            skipped=res.skipped)

    # -- /ack and /unlock -----------------------------------------------------------------
    def decode(self, request_id: str) -> BatchRef:
        """Verify a requestId, and that it was handed out for this gateway's broker."""
        ref = self.codec.decode(request_id)
        if ref.broker != self.broker.name:
            raise bad_request("invalid_request_id", f"requestId was issued for broker "
                              f"{ref.broker!r}; this gateway serves {self.broker.name!r}")
        return ref

    async def ack(self, request_id: str, credential: Credential | None = None) -> AckResult:
        return await self.commit(self.decode(request_id), credential)

    async def commit(self, ref: BatchRef, credential: Credential | None, wake: bool = True,
                     check_only: bool = False) -> AckResult:
        """Ack the batch ``ref`` names (``check_only``: say what an ack would do, commit nothing)."""
        r = await self.store.ack(ref.group, ref.client_id, ref.topic, ref.queue, ref.offset,
                                 ref.next_offset, ref.token,
                                 default_timeout_ms=self.settings.consume_timeout_ms,
                                 high_watermark=ref.high_watermark, credential=credential,
                                 check_only=check_only)
        if r.result is AckOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.group)
        if check_only:
            return r
        if self.on_ack is not None:
            self.on_ack(r)
        if wake and r.result is AckOutcome.COMMITTED:  # the queue is free, and may hold more
            self.room.wake((ref.topic, ref.group, ref.client_id))
        return r

    async def unlock(self, request_id: str, credential: Credential | None = None) -> UnlockResult:
        ref = self.decode(request_id)
        r = await self.store.unlock(ref.group, ref.client_id, ref.topic, ref.queue, ref.token,
                                    ref.high_watermark, credential)
        if r.result is UnlockOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.group)
        if r.result is UnlockOutcome.UNLOCKED:  # the batch is up for grabs again
            self.room.wake((ref.topic, ref.group, ref.client_id))
        return r
