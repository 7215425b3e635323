"""The fetch path of ``/message``: choose and lock one queue in Redis, read it at the committed
offset, and hand out the records with a signed requestId; or wait for work.

A long poll that finds nothing waits in the process's :class:`~.waiting.WaitRoom`, which wakes
waiters in numbers that match the work (new records, a freed queue, a lock expiring), so a
waiting poll costs no Redis call and a crowd of them costs what one costs. The consumer's retry
topic is served beside the asked one, due retries first, when :class:`~.retry_topics.RetryTopics`
says it is worth a look. The piggy-backed ack and the requestId side are core/consume.py's.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from enum import Enum

from ..broker import (
    Broker,
    BrokerUnavailable,
    Capability,
    Record,
    Skipped,
    UnknownTopic,
)
from ..config import Settings
from ..store import (
    AckResult,
    Credential,
    Lock,
    NeedsRestore,
    NoQueue,
    OffsetStore,
    Paused,
    RateLimited,
    Refusal,
    Refused,
    now_ms,
)
from .auth import Authorizer
from .checkpoint import Checkpoints
from .errors import DomainError, Forbidden, Invalid, invalid
from .registry_copy import RegistryCopy
from .requestid import BatchRef, RequestIdCodec
from .retry_topics import MEMO_MAX, RetryTopics
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
#: A batch answered with less than this share of its lock left (at most LATE_MAX_MS) is flagged
#: redelivered: see :meth:`Batch.redelivered_at`.
LATE_SHARE = 0.1
LATE_MAX_MS = 1_000

#: How each refusal of choose.lua is told (``unauthorized`` is the authorizer's to tell).
_REFUSED: dict[Refusal, tuple[type[DomainError], str, str]] = {
    Refusal.UNREGISTERED: (Forbidden, "unregistered_consumer", "consumer {c!r} is not registered "
                           "(PUT /admin/consumers/{c}, or run the gateway in open mode)"),
    Refusal.TOPIC_NOT_ALLOWED: (Forbidden, "topic_not_allowed",
                                "consumer {c!r} is not registered for topic {t!r}"),
    Refusal.CLIENT_ID_REQUIRED: (Invalid, "client_id_required", "consumer {c!r} is registered "
                                 "in broadcast mode: every request needs a clientId"),
    Refusal.CLIENT_ID_NOT_ALLOWED: (Invalid, "client_id_not_allowed", "consumer {c!r} is "
                                    "registered in cluster mode: a clientId is not allowed"),
}


#: A tag: what RocketMQ takes (no '|', which separates them in a filter), up to 128 characters.
TAG = re.compile(r"[^|\x00-\x1f]{1,128}")
#: A tag filter's length at most (RocketMQ's subscription expression travels in every pull).
TAG_FILTER_MAX = 1024


def parse_tag_filter(text: str | None) -> frozenset[str] | None:
    """``A||B`` (RocketMQ's TAG expression; blanks around tags ignored, ``*`` for all) -> the
    tags; None for no filter."""
    if text is None or text.strip() in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in text.split("||"))
    if len(text) > TAG_FILTER_MAX or not all(TAG.fullmatch(t) for t in tags):
        raise invalid("invalid_tag", "tag must be tags separated by '||' (e.g. 'A||B'), each "
                      f"1-128 characters without '|' or control characters, {TAG_FILTER_MAX} "
                      "characters in all at most")
    return tags


def tag_expression(tags: frozenset[str] | None) -> str:
    """The filter as RocketMQ writes it, one spelling per set ("" for none)."""
    return "||".join(sorted(tags)) if tags else ""


class FetchStatus(str, Enum):
    OK = "ok"  # a batch was locked and read
    EMPTY = "empty"  # nothing to read before the wait ran out
    PAUSED = "paused"  # an operator paused the consumer
    RATE_LIMITED = "rate_limited"  # over the consumer's rate limit: retry after retry_after_ms


@dataclass(frozen=True, slots=True)
class FetchParams:
    consumer: str
    client_id: str
    topic: str
    max_messages: int
    wait_ms: int
    address: str
    ack_request_id: str = ""
    credential: Credential | None = None  # None: auth is off
    #: Only records with one of these tags (a broker with Capability.TAG_FILTER); the others
    #: are stepped over and committed past, as a RocketMQ subscription does.
    tags: frozenset[str] | None = None
    #: The most bytes of records a batch holds, 0 for no limit: the broker's read stops there
    #: (``broker.fitting``: the first record whatever its size, as Kafka's ``fetch.max.bytes``).
    max_bytes: int = 0
    #: More topics of the same fetch (``topic`` is the first): the batch comes from whichever
    #: has records first (core/consume.py).
    also_topics: tuple[str, ...] = ()
    #: Where a queue new to the consumer starts (``earliest``/``latest``) unless its
    #: registration says; "" for the gateway's ``start_position`` (a REST v2 instance's
    #: ``auto.offset.reset``).
    start: str = ""

    @property
    def topics(self) -> tuple[str, ...]:
        return (self.topic, *self.also_topics)


@dataclass(frozen=True, slots=True)
class Batch:
    """Records read from one locked queue; ``request_id`` acks (or unlocks) them on any node."""

    request_id: str
    topic: str  # the asked topic, or the consumer's retry topic for it
    queue: str
    offset: int  # the committed offset the batch starts at
    next_offset: int  # the committed offset after a successful ack
    backlog: int  # records not yet committed in this queue, this batch included
    redelivered: bool  # the batch starts below how far the queue was handed out before
    lock_timeout_ms: int
    records: list[Record]
    skipped: Skipped | None = None  # offsets the broker stepped over before the first record
    ref: BatchRef | None = None  # what ``request_id`` carries (saves decoding it again)
    #: When the lock runs out (this node's clock, ms); 0: unknown (never flags by itself).
    lock_expires_ms: int = 0

    def redelivered_at(self, now: int) -> bool:
        """The flag to answer with at ``now``, the moment the answer is written.

        Besides a batch starting below the queue's handed-out mark, a batch whose lock has run
        out (or nearly: under a tenth of it left, 1 s at most) by the time it is answered is
        flagged: a node stalled between choose and its answer (a GC pause, a starved CPU, a
        slow broker read; SIGSTOP in the duplicate audit) answers after another fetch may
        have taken the queue and handed the same records out, so the late answer may reach a
        client second. Flagged, a client that deduplicates on the flag skips it (its ack will
        be refused ``lock_lost`` anyway). The margin covers the answer's way to the client."""
        if self.redelivered or not self.lock_expires_ms:
            return self.redelivered
        margin = min(int(self.lock_timeout_ms * LATE_SHARE), LATE_MAX_MS)
        return now >= self.lock_expires_ms - margin


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
class PollControl:
    """Lets a fetch over several topics end its other long polls once one has answered.

    A poll is cancelled only while it sits in the wait room: cancelled inside a choose (a
    script sent, its reply not yet read) its queue would stay locked until the lock timed out,
    which a unit test caught as a flake (the other topic's next fetch answered empty). A poll
    that is choosing or reading when ``stop`` is set finishes that step, hands its batch to
    the caller (which gives it back), and does not wait again."""

    waiting: bool = False  # suspended in the wait room: safe to cancel
    stop: bool = False


@dataclass(slots=True)
class _Try:
    """What one /message request learned while it looked at queues."""

    p: FetchParams
    skip: set[tuple[str, str]] = field(default_factory=set)  # (topic, queue): nothing readable
    announced: bool = False
    restored: int = 0
    copy_checked: bool = False  # the registry's copy was looked at (registry_copy.ensure)


class Fetcher:
    """Runs the choose-lock-read loop of one ``/message`` (after its piggy-backed ack)."""

    def __init__(self, settings: Settings, store: OffsetStore, broker: Broker,
                 watermarks: Watermarks, codec: RequestIdCodec, authorizer: Authorizer,
                 room: WaitRoom, retries: RetryTopics, checkpoints: Checkpoints | None,
                 registry_copy: RegistryCopy | None) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.wm = watermarks
        self.codec = codec
        self.auth = authorizer
        self.room = room
        self.retries = retries
        #: Where offsets Redis lost are restored from (None: a consumer starts at ``start``).
        self.checkpoints = checkpoints
        #: The registry's durable copy: a Redis that lost the registry gets it back before a
        #: refusal or a new queue's start position is decided on what is left.
        self.registry_copy = registry_copy
        self._seen: dict[str, int] = {}

    async def fetch(self, p: FetchParams, retry: str,
                    control: PollControl | None = None) -> Fetched:
        """A batch of ``p.topic`` or of its retry topic ``retry``, or why there is none."""
        if p.tags and Capability.TAG_FILTER not in self.broker.capabilities:
            raise invalid("tag_filter_unsupported", f"the {self.broker.name} broker has no "
                          "message tags: fetch without 'tag'")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + p.wait_ms / 1000
        t = _Try(p)
        key = (p.topic, p.consumer, p.client_id)
        waited = looked_again = False
        while True:
            version = self.wm.version(p.topic)
            targets = [p.topic]
            serve = await self.retries.serve(retry, p.consumer, p.client_id)
            retry_version = self.wm.version(retry)  # the copy serve and choose decided on
            if serve:
                targets.insert(0, retry)  # due retries first: they waited long enough
            nothing: list[NoQueue] = []
            for topic in targets:
                got = await self._try(t, topic)
                if isinstance(got, Fetched):
                    if got.batch is not None and waited:
                        # woken polls pass the baton: there may be more work than counted
                        self.room.wake(key)
                    return got
                if got is None:  # a queue came back empty or offsets were restored: again
                    break
                nothing.append(got)
                if topic == retry and got.wake_ms < 0:  # nothing to retry until records come
                    self.retries.idle(retry, p.consumer, p.client_id, retry_version)
            else:
                remaining = deadline - loop.time()
                if remaining <= 0 or (control is not None and control.stop):
                    return Fetched(FetchStatus.EMPTY, p.topic)
                # Records came during choose, or the retry topic's copy was refreshed since serve
                # and choose read it (their stale read started that refresh; landing before the
                # wait, its highs would be the watcher's baseline and the new retry would never
                # wake the poll: a redriven record waited for the 5 s re-check): look again, once.
                moved = self.wm.version(p.topic) != version or \
                    (serve is not None and self.wm.version(retry) != retry_version)
                if moved and not looked_again:
                    looked_again = True
                else:
                    looked_again = False
                    wakes = [n.wake_ms for n in nothing if n.wake_ms >= 0]
                    if serve is None:  # woken if a listing finds the retry topic meanwhile
                        self.retries.waiting_without(retry, key)
                    if control is not None:
                        control.waiting = True
                    try:
                        woken = await self.room.wait(
                            key, remaining, self._recheck_s(NoQueue(min(wakes, default=-1)),
                                                            bool(t.skip)),
                            also=retry if serve is not None else None)
                    finally:
                        if control is not None:
                            control.waiting = False
                        if serve is None:
                            self.retries.done_waiting(retry, key)
                    if not woken:
                        # The wait ran out and nothing woke it: nothing came that it could take
                        # (new records, a freed queue and lock expiry all wake a waiter). No last
                        # choose: it would cost every idle poll a second script per cycle.
                        return Fetched(FetchStatus.EMPTY, p.topic)
                    waited = True
                t.skip.clear()

    async def _try(self, t: _Try, topic: str) -> Fetched | NoQueue | None:
        """Choose, lock and read one queue of ``topic`` (the asked topic, or the consumer's retry
        topic for it): a final answer, NoQueue, or None to look again at once."""
        p = t.p
        try:
            wm = await self.wm.get(topic)
        except UnknownTopic:
            if topic != p.topic:  # the retry topic went away (deleted by an operator)
                return NoQueue(-1)
            await self.auth.require_consume(p.credential, p.consumer)  # 401/403 before 404
            raise
        chosen = await self.store.choose(
            p.consumer, p.client_id, topic, self.wm.marks(topic) or wm, address=p.address,
            default_timeout_ms=self.settings.consume_timeout_ms,
            default_start=p.start or self.settings.start_position,
            client_idle_ms=self.settings.client_idle_ms, max_messages=p.max_messages,
            open_mode=self.settings.open_mode, credential=p.credential,
            skip={q for tp, q in t.skip if tp == topic},
            restore=self.checkpoints is not None and self.checkpoints.enabled,
            registered_as=p.topic, settings_lost=lambda: self._registry_restored(t))
        if isinstance(chosen, (Refused, NeedsRestore)) and await self._registry_restored(t):
            return None  # decided on a Redis that had lost the registry: again with it
        if isinstance(chosen, Refused):
            raise await self._refused(chosen.reason, p)
        if isinstance(chosen, NeedsRestore):
            assert self.checkpoints is not None  # choose asks only when restores are on
            t.restored += 1
            if t.restored > 3:  # each restore seeds every queue of wm: only a Redis emptied
                raise BrokerUnavailable("offsets being restored")  # again and again gets here
            await self.checkpoints.restore(p.consumer, topic, chosen.start, wm)
            self._seen.pop(p.consumer, None)  # Redis lost the seen list too: announce again
            return None
        if not t.announced:  # only names choose.lua accepted (key, registration) are listed
            t.announced = True
            try:
                await self._announce(p.consumer)
            except BaseException:
                if isinstance(chosen, Lock):
                    await asyncio.shield(self._give_back(p, topic, chosen))
                raise
        if isinstance(chosen, Paused):  # answered at once, never long-polled
            return Fetched(FetchStatus.PAUSED, p.topic)
        if isinstance(chosen, RateLimited):
            return Fetched(FetchStatus.RATE_LIMITED, p.topic, retry_after_ms=chosen.retry_after_ms)
        if isinstance(chosen, Lock):
            # Redis remembers how far the queue was handed out, whoever released it since
            # (choose.lua's rdl): a batch starting below that mark is a redelivery. (An expired
            # lock counts too when a gateway from before the mark took it.)
            batch = await self._pull(p, topic, chosen,
                                     redelivered=chosen.previous_lock_ms > 0
                                     or chosen.committed < chosen.redeliver_below)
            if batch is not None:
                return Fetched(FetchStatus.OK, p.topic, batch=batch)
            t.skip.add((topic, chosen.queue))  # nothing readable there now: try the others first
            return None
        return chosen

    async def _refused(self, reason: Refusal, p: FetchParams) -> DomainError:
        if reason is Refusal.UNAUTHORIZED:
            return await self.auth.consume_refused(p.credential, p.consumer)
        kind, code, text = _REFUSED[reason]
        return kind(code, text.format(c=p.consumer, t=p.topic))

    async def _announce(self, consumer: str) -> None:
        """List the consumer among those seen (once a minute per process) for the views."""
        now = now_ms()
        if now - self._seen.get(consumer, 0) >= SEEN_EVERY_MS:
            if len(self._seen) >= MEMO_MAX:  # a memo, not a registry: start over rather than grow
                self._seen.clear()
            self._seen[consumer] = now
            await self.store.mark_seen(consumer)

    def _recheck_s(self, none: NoQueue, skipped: bool) -> float:
        """When a poll that found nothing should re-run choose unprompted (see waiting.py).
        ``skipped``: it passed over queues whose read came back empty although they hold a
        backlog (a slow broker, a tail race); nothing will signal them, so look again soon."""
        if none.wake_ms >= 0:  # a lock over a backlog expires then (or is freed sooner elsewhere)
            return min(RECHECK_S, max(0.0, (none.wake_ms - now_ms()) / 1000) + 0.002)
        return RECHECK_S if skipped else IDLE_RECHECK_S

    async def _give_back(self, p: FetchParams, topic: str, lock: Lock) -> None:
        await self.store.unlock(p.consumer, p.client_id, topic, lock.queue, lock.token)
        if lock.charged:
            await self.store.refund(p.consumer, lock.allowance, client_id=p.client_id,
                                    queue=lock.queue)

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
            res = await self.broker.fetch(topic, lock.queue, start, lock.allowance, p.tags,
                                          p.max_bytes)
        except BaseException:
            # The broker failed (or the client went away): free the queue for the next fetch now
            # rather than after the consume timeout, and give back the rate-limit tokens charged
            # for records nobody received (a broker blip must not turn into 429s afterwards).
            await asyncio.shield(self._give_back(p, topic, lock))
            raise
        self.wm.observe(topic, lock.queue, res.high_watermark)
        records, next_offset = res.records, res.next_offset
        if lock.charged and len(records) < lock.allowance:  # short, or cut by max_bytes
            await self.store.refund(p.consumer, lock.allowance - len(records),
                                    client_id=p.client_id, queue=lock.queue)
        if not res.records:
            if res.next_offset > start:  # nothing readable past a skip: move past it ourselves
                await self.store.ack(p.consumer, p.client_id, topic, lock.queue, start,
                                     res.next_offset, lock.token,
                                     default_timeout_ms=self.settings.consume_timeout_ms,
                                     high_watermark=res.high_watermark)
            else:
                await self.store.unlock(p.consumer, p.client_id, topic, lock.queue, lock.token,
                                        res.high_watermark)
            return None
        if next_offset - start > lock.allowance:
            # Its offsets span more than choose.lua's bound (start + allowance) assumed: markers,
            # aborted records, holes. Said before the answer, so a takeover after this lock
            # expires flags all of it (one script more, for such batches only).
            await self.store.handed_out(p.consumer, p.client_id, topic, lock.queue, lock.token,
                                        next_offset)
        ref = BatchRef(self.broker.name, p.consumer, p.client_id, topic, lock.queue, start,
                       next_offset, lock.token, res.high_watermark, fetched,
                       tag_expression(p.tags))
        return Batch(
            request_id=self.codec.encode(ref), topic=topic, queue=lock.queue, offset=start,
            next_offset=next_offset,
            backlog=max(lock.max_offset, res.high_watermark) - start,
            redelivered=redelivered, lock_timeout_ms=lock.timeout_ms, records=records,
            skipped=res.skipped, ref=ref,
            lock_expires_ms=lock.locked_at + lock.timeout_ms if lock.locked_at else 0)

