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
from dataclasses import dataclass
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
from .requestid import BatchRef, RequestIdCodec
from .waiting import WaitRoom
from .watermarks import Watermarks

#: While long-polling with a backlog held under other consumers' locks, re-run choose this
#: often: an ack or early unlock on another node frees the queue without any other signal.
RECHECK_S = 1.0
#: With no backlog anywhere only new records (seen as a watermark change, no Redis call per
#: waiter) or an offset reset create work, so a slow re-check is enough.
IDLE_RECHECK_S = 5.0
#: Each process re-announces the consumers it serves (for the all-consumer views) this often.
SEEN_EVERY_MS = 60_000

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


class ConsumeService:
    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 watermarks: Watermarks, codec: RequestIdCodec, authorizer: Authorizer,
                 on_ack: Callable[[AckResult], None] | None = None,
                 checkpoints: Checkpoints | None = None) -> None:
        self.settings = settings
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
        self.room = WaitRoom(self._highs, watermarks.refresh_s, IDLE_RECHECK_S)

    async def _highs(self, topic: str) -> dict[str, int]:
        return {q: hi for q, (_lo, hi) in (await self.wm.get(topic)).items()}

    # -- /message -------------------------------------------------------------------------
    async def fetch(self, p: FetchParams) -> Fetched:
        acked: AckResult | None = None
        if p.ack_request_id:
            ref = self._decode(p.ack_request_id)
            if (ref.group, ref.client_id, ref.topic) != (p.group, p.client_id, p.topic):
                raise bad_request("request_id_mismatch",
                                  "requestId belongs to another consumer, clientId or topic")
            acked = await self._ack(ref, p.credential, wake=False)  # its sender chooses next
        announced = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + p.wait_ms / 1000
        skip: set[str] = set()  # queues that had nothing readable during this request
        # queues this request took over from an expired lock: if the first read comes back empty
        # and the queue is taken again later in the request, its batch is still a redelivery
        taken_over: set[str] = set()
        key = (p.topic, p.group, p.client_id)
        waited = looked_again = False
        restored = 0
        while True:
            try:
                wm = await self.wm.get(p.topic)
            except UnknownTopic:
                await self.auth.require_consume(p.credential, p.group)  # 401/403 before 404
                raise
            version = self.wm.version(p.topic)
            chosen = await self.store.choose(
                p.group, p.client_id, p.topic, wm, address=p.address,
                default_timeout_ms=self.settings.consume_timeout_ms,
                default_start=self.settings.start_position,
                client_idle_ms=self.settings.client_idle_ms, max_messages=p.max_messages,
                open_mode=self.settings.open_mode, credential=p.credential, skip=skip,
                restore=self.checkpoints is not None and self.checkpoints.enabled)
            if isinstance(chosen, Refused):
                raise await self._refused(chosen.reason, p)
            if isinstance(chosen, NeedsRestore):
                assert self.checkpoints is not None  # choose asks only when restores are on
                restored += 1
                if restored > 3:  # each restore marks the topic: only a Redis emptied again and
                    raise BrokerUnavailable("offsets being restored")  # again gets here
                await self.checkpoints.restore(p.group, p.topic)
                self._seen.pop(p.group, None)  # Redis lost the seen list too: announce again
                continue
            if not announced:  # only names choose.lua accepted (key, registration) are listed
                announced = True
                try:
                    await self._announce(p.group)
                except BaseException:
                    if isinstance(chosen, Lock):
                        await asyncio.shield(self._give_back(p, chosen))
                    raise
            if isinstance(chosen, Paused):  # answered at once, never long-polled
                return Fetched(FetchStatus.PAUSED, p.topic, ack=acked)
            if isinstance(chosen, RateLimited):
                return Fetched(FetchStatus.RATE_LIMITED, p.topic, ack=acked,
                               retry_after_ms=chosen.retry_after_ms)
            if isinstance(chosen, Lock):
                if chosen.previous_lock_ms > 0:
                    taken_over.add(chosen.queue)
                batch = await self._pull(p, chosen, redelivered=chosen.queue in taken_over)
                if batch is not None:
                    if waited:  # woken polls pass the baton: there may be more work than counted
                        self.room.wake(key)
                    return Fetched(FetchStatus.OK, p.topic, batch=batch, ack=acked)
                skip.add(chosen.queue)  # nothing readable there right now: try the others first
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                return Fetched(FetchStatus.EMPTY, p.topic, ack=acked)
            if self.wm.version(p.topic) != version and not looked_again:
                looked_again = True  # records came during choose: look again, once, not in a loop
            else:
                looked_again = False
                if not await self.room.wait(key, remaining, self._recheck_s(chosen, bool(skip))):
                    # The wait ran out and nothing woke it: nothing came that it could take (new
                    # records, a freed queue and lock expiry all wake a waiter). No last choose:
                    # it would cost every idle poll a second script per cycle.
                    return Fetched(FetchStatus.EMPTY, p.topic, ack=acked)
                waited = True
            skip.clear()

    async def _refused(self, reason: str, p: FetchParams) -> DomainError:
        if reason == "unauthorized":
            return await self.auth.consume_refused(p.credential, p.group)
        kind, text = _REFUSED[reason]
        return kind(_UNREGISTERED_CODE.get(reason, reason), text.format(g=p.group, t=p.topic))

    async def _announce(self, group: str) -> None:
        """List the consumer among those seen (once a minute per process) for the views."""
        now = now_ms()
        if now - self._seen.get(group, 0) >= SEEN_EVERY_MS:
            if len(self._seen) >= 100_000:  # a memo, not a registry: start over rather than grow
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

    async def _give_back(self, p: FetchParams, lock: Lock) -> None:
        await self.store.unlock(p.group, p.client_id, p.topic, lock.queue, lock.token)
        if lock.charged:
            await self.store.refund(p.group, lock.allowance)

    async def _pull(self, p: FetchParams, lock: Lock, redelivered: bool) -> Batch | None:
        """Read the locked queue; None (with the lock released or the skip committed) if empty."""
        start = lock.committed
        try:
            res = await self.broker.fetch(p.topic, lock.queue, start, lock.allowance)
        except BaseException:
            # The broker failed (or the client went away): free the queue for the next fetch now
            # rather than after the consume timeout, and give back the rate-limit tokens charged
            # for records nobody received (a broker blip must not turn into 429s afterwards).
            await asyncio.shield(self._give_back(p, lock))
            raise
        self.wm.observe(p.topic, lock.queue, res.high_watermark)
        if lock.charged and len(res.records) < lock.allowance:  # rare: a read came back short
            await self.store.refund(p.group, lock.allowance - len(res.records))
        if not res.records:
            if res.next_offset > start:  # nothing readable past a skip: move past it ourselves
                await self.store.ack(p.group, p.client_id, p.topic, lock.queue, start,
                                     res.next_offset, lock.token,
                                     default_timeout_ms=self.settings.consume_timeout_ms,
                                     high_watermark=res.high_watermark)
            else:
                await self.store.unlock(p.group, p.client_id, p.topic, lock.queue, lock.token,
                                        res.high_watermark)
            return None
        ref = BatchRef(self.broker.name, p.group, p.client_id, p.topic, lock.queue, start,
                       res.next_offset, lock.token, res.high_watermark)
        return Batch(
            request_id=self.codec.encode(ref), queue=lock.queue, offset=start,
            next_offset=res.next_offset,
            backlog=max(lock.max_offset, res.high_watermark) - start,
            redelivered=redelivered, lock_timeout_ms=lock.timeout_ms, records=res.records,
            skipped=res.skipped)

    # -- /ack and /unlock -----------------------------------------------------------------
    def _decode(self, request_id: str) -> BatchRef:
        """Verify a requestId, and that it was handed out for this gateway's broker."""
        ref = self.codec.decode(request_id)
        if ref.broker != self.broker.name:
            raise bad_request("invalid_request_id", f"requestId was issued for broker "
                              f"{ref.broker!r}; this gateway serves {self.broker.name!r}")
        return ref

    async def ack(self, request_id: str, credential: Credential | None = None) -> AckResult:
        return await self._ack(self._decode(request_id), credential)

    async def _ack(self, ref: BatchRef, credential: Credential | None, wake: bool = True) -> AckResult:
        r = await self.store.ack(ref.group, ref.client_id, ref.topic, ref.queue, ref.offset,
                                 ref.next_offset, ref.token,
                                 default_timeout_ms=self.settings.consume_timeout_ms,
                                 high_watermark=ref.high_watermark, credential=credential)
        if r.result is AckOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.group)
        if self.on_ack is not None:
            self.on_ack(r)
        if wake and r.result is AckOutcome.COMMITTED:  # the queue is free, and may hold more
            self.room.wake((ref.topic, ref.group, ref.client_id))
        return r

    async def unlock(self, request_id: str, credential: Credential | None = None) -> UnlockResult:
        ref = self._decode(request_id)
        r = await self.store.unlock(ref.group, ref.client_id, ref.topic, ref.queue, ref.token,
                                    ref.high_watermark, credential)
        if r.result is UnlockOutcome.UNAUTHORIZED:
            raise await self.auth.consume_refused(credential, ref.group)
        if r.result is UnlockOutcome.UNLOCKED:  # the batch is up for grabs again
            self.room.wake((ref.topic, ref.group, ref.client_id))
        return r
