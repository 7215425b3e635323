"""Offset store: every consumer's queue offsets, locks and access times, held in Redis.

Key names are in keys.py (the layout table is there), the scripts in lua/ with their shared
prelude (scripts.py loads them). Choose+lock, ack and unlock are each exactly one Lua script
call, so no decision is ever made on a value read earlier from Python; the API-key check, the
registration check and the rate-limit token bucket happen inside those same calls.

:class:`OffsetStore` owns the Redis client; the registry records (:attr:`OffsetStore.registry`),
the alert state (:attr:`OffsetStore.alerts`) and the batched reads of the views
(:meth:`OffsetStore.read_consumers`) use the same client through it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, NamedTuple, TypeVar, cast

from redis.asyncio import Redis

from . import scripts
from .alerts import AlertStore
from .connect import MAX_CONNECTIONS, POOL_TIMEOUT_S, connect, database, fields, text, text_dict
from .delay import DelayStore
from .instances import InstanceStore
from .keys import KeyLayout, queue_field
from .marks import MarkLog, SharedCopy
from .queues import QueueState, parse_queue_hash
from .registry import RegistryStore
from .registry_copy import RegistryCopyStore
from .shards import ShardCounts, owned, part, shard_name, shard_of
from .views import ConsumerRead, read_consumers


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Credential:
    """An API key as presented: its id and the SHA-256 (hex) of the whole key."""

    key_id: str
    sha256: str


#: What the scripts get when auth is off.
NO_CREDENTIAL = Credential("", "")


@dataclass(frozen=True, slots=True)
class Lock:
    """A queue locked for one batch."""

    queue: str
    committed: int
    token: int
    max_offset: int
    previous_lock_ms: int  # >0 means the previous holder's lock expired: this is a redelivery
    timeout_ms: int
    allowance: int  # records this batch may hold: the request, the consumer's cap, the rate limit
    charged: bool = False  # the rate-limit bucket paid for `allowance`: refund what is not read
    #: How far the queue may have been handed out (an expired lock's batch, a batch handed back
    #: with /unlock, a rewind, a restore from the broker's checkpoint after a Redis loss): a batch
    #: starting below it is a redelivery.
    redeliver_below: int = 0
    #: The time (this node's clock, ms) choose.lua stamped the lock with: it runs out at
    #: ``locked_at + timeout_ms``, when another fetch may take the queue.
    locked_at: int = 0


R = TypeVar("R")
V = TypeVar("V")


class Chosen(IntEnum):
    """What choose.lua decided: the first element of its reply (the rest depends on it)."""

    NO_QUEUE = 0  # {0, wake_ms}: nothing to lock now -> NoQueue
    LOCKED = 1  # {1, queue, committed, token, ...}: a queue was locked -> Lock
    PAUSED = 2  # {2} -> Paused
    REFUSED = 3  # {3, reason}: the caller may not consume here -> Refused
    RATE_LIMITED = 4  # {4, retry_after_ms} -> RateLimited
    NEEDS_RESTORE = 5  # {5, start}: a queue has no committed offset -> NeedsRestore
    SEND_ALL = 6  # {6}: a delta request the script cannot serve: sent again with every queue
    RESHARD = 7  # {7, shards}: the consumer has another shard count than the caller's (shards.py)


class Refusal(str, Enum):
    """Why choose.lua refused a caller (``{3, reason}``)."""

    UNAUTHORIZED = "unauthorized"  # auth on, and the key may not consume as this consumer
    UNREGISTERED = "unregistered"  # not registered, and the gateway is not in open mode
    TOPIC_NOT_ALLOWED = "topic_not_allowed"  # registered, but not for this topic
    CLIENT_ID_REQUIRED = "client_id_required"  # registered in broadcast mode, no clientId
    CLIENT_ID_NOT_ALLOWED = "client_id_not_allowed"  # registered in cluster mode, a clientId


@dataclass(frozen=True, slots=True)
class Refused:
    """The caller may not consume here."""

    reason: Refusal


@dataclass(frozen=True, slots=True)
class RateLimited:
    """Over the consumer's rate limit; a token is due in ``retry_after_ms``."""

    retry_after_ms: int


@dataclass(frozen=True, slots=True)
class NoQueue:
    """Nothing to lock now; ``wake_ms`` is when the earliest held lock with a backlog expires."""

    wake_ms: int  # -1: no queue has a backlog


@dataclass(frozen=True, slots=True)
class Paused:
    """The consumer is paused: nothing was locked."""


@dataclass(frozen=True, slots=True)
class NeedsRestore:
    """A queue has no committed offset: :meth:`OffsetStore.restore` the topic's queues (from the
    broker's checkpoint, or at ``start`` written there first), then choose again."""

    start: str  # the consumer's start position for this topic: 'earliest' | 'latest'


class AckOutcome(str, Enum):
    """What ack.lua decided, the first element of its reply (``unauthorized`` never leaves the
    core: it becomes an error)."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"
    LOCK_LOST = "lock_lost"  # another fetch took the queue
    OFFSET_RESET = "offset_reset"  # an operator reset the queue after the fetch
    OFFSET_MISMATCH = "offset_mismatch"
    UNKNOWN = "unknown"  # no such queue for this consumer
    UNAUTHORIZED = "unauthorized"


class LockState(str, Enum):
    """Where the lock of a committed batch stood when ack.lua committed it (``""`` otherwise)."""

    HELD = "held"
    EXPIRED = "expired"  # past the consume timeout, but nobody took the queue since
    RELEASED = "released"  # unlocked (or a piggy-backed ack after an unlock)
    NONE = ""  # not committed: no lock state to tell


class UnlockOutcome(str, Enum):
    """What unlock.lua decided, the first element of its reply."""

    UNLOCKED = "unlocked"
    NOT_LOCKED = "not_locked"
    LOCK_LOST = "lock_lost"
    UNKNOWN = "unknown"
    UNAUTHORIZED = "unauthorized"


class ExtendOutcome(str, Enum):
    """What extend.lua decided, the first element of its reply (``unauthorized`` never leaves
    the core: it becomes an error)."""

    EXTENDED = "extended"
    ALREADY_COMMITTED = "already_committed"
    LOCK_LOST = "lock_lost"
    OFFSET_RESET = "offset_reset"
    OFFSET_MISMATCH = "offset_mismatch"
    NOT_LOCKED = "not_locked"  # handed back with /unlock: redelivered, not held again
    UNKNOWN = "unknown"
    UNAUTHORIZED = "unauthorized"


class ProduceVerdict(str, Enum):
    """What produce_check.lua decided, the first element of its reply."""

    OK = "ok"
    UNAUTHENTICATED = "unauthenticated"  # no such key, or not its secret
    FORBIDDEN = "forbidden"  # the key may not produce as this producer (or as any)
    PRODUCER_REQUIRED = "producer_required"  # the key (or open mode) names no single producer
    UNREGISTERED_PRODUCER = "unregistered_producer"
    TOPIC_NOT_ALLOWED = "topic_not_allowed"  # the producer is not registered for the topic


@dataclass(frozen=True, slots=True)
class AckResult:
    result: AckOutcome
    committed: int
    lock_state: LockState


@dataclass(frozen=True, slots=True)
class PendingAck:
    """What committing one pending batch of a REST v2 instance did."""

    request_id: str
    topic: str
    queue: str
    offset: int
    #: None: a batch written by an older gateway, left pending (ack it by its requestId)
    result: AckResult | None


class InstanceGone(Exception):
    """The REST v2 instance was deleted, or expired."""


class UnlockResult(NamedTuple):
    result: UnlockOutcome
    committed: int


class ExtendResult(NamedTuple):
    result: ExtendOutcome
    committed: int
    timeout_ms: int  # the lock's new timeout, from now; 0 unless extended


#: choose.lua rebuilds a topic's queue indexes from the hash when they are older than this: what
#: a gateway that does not keep them wrote meanwhile (a rolling upgrade) heals within it. One scan
#: of every queue per consumer hash and topic a minute (15 ms at 4,096 queues: BENCHMARKS.md).
INDEX_REBUILD_MS = 60_000
#: Consumer hashes and topics for which this process remembers which version of its watermark
#: copy Redis absorbed (forgetting one costs one full request).
ABSORBED_ENTRIES = 65_536
#: Times a choice is routed again after choose.lua said the consumer's shard count changed.
RESHARD_TRIES = 4
#: Consumers whose round-robin turn over shards a process keeps (then it starts over).
TURNS_KEPT = 65_536


@dataclass(frozen=True, slots=True)
class _Reshard:
    """choose.lua's ``{7, shards}``: the consumer has ``shards`` shards, not the caller's count."""

    shards: int


class OffsetStore:
    def __init__(self, redis: Redis, prefix: str = "mqgw") -> None:
        self.redis = redis  # for this package (and tests that inspect Redis); nobody else
        self.prefix = prefix
        self.index_rebuild_ms = INDEX_REBUILD_MS
        #: (queue hash, topic, copy source) -> the copy's version the hash has absorbed
        self._absorbed: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        #: the same -> the full request under way for it (others wait for it)
        self._first: dict[tuple[str, str, str], asyncio.Future[None]] = {}
        self.layout = KeyLayout(prefix, database(redis))  # channel names carry the database
        #: each consumer's shard count (store/shards.py), and where its next walk starts
        self.shards = ShardCounts(redis, self.layout)
        self._turns: dict[str, int] = {}
        self._choose = scripts.register(redis, "choose")
        self._ack = scripts.register(redis, "ack")
        self._ack_instance = scripts.register(redis, "instance_commit")
        self._unlock = scripts.register(redis, "unlock")
        self._handed = scripts.register(redis, "handed")
        self._extend = scripts.register(redis, "extend")
        self._wm_get = scripts.register(redis, "watermarks")
        self._wm_put = scripts.register(redis, "watermarks_put")
        self._reset = scripts.register(redis, "reset")
        self._produce_check = scripts.register(redis, "produce_check")
        self._refund = scripts.register(redis, "refund")
        self._restore = scripts.register(redis, "restore")
        self.registry = RegistryStore(redis, self.layout)
        self.registry_copy = RegistryCopyStore(redis, self.layout, self.registry)
        self.alerts = AlertStore(redis, self.layout)
        self.delay = DelayStore(redis, self.layout)
        self.instances = InstanceStore(redis, self.layout)

    @classmethod
    def connect(cls, url: str, prefix: str = "mqgw", max_connections: int = MAX_CONNECTIONS,
                pool_timeout_s: float = POOL_TIMEOUT_S) -> OffsetStore:
        """A store with a client of its own (``redis://`` or ``redis+cluster://``) and a bounded
        pool that commands wait for (see :func:`.connect.connect`); close it with :meth:`aclose`."""
        return cls(connect(url, max_connections, pool_timeout_s), prefix)

    async def aclose(self) -> None:
        await self.redis.aclose()

    # -- key names (keys.py) ------------------------------------------------------------------
    def queues_key(self, consumer: str, client_id: str = "") -> str:
        return self.layout.queues(consumer, client_id)

    def config_key(self, consumer: str) -> str:
        return self.layout.config(consumer)

    def clients_key(self, consumer: str) -> str:
        return self.layout.clients(consumer)

    def grants_key(self, consumer: str) -> str:
        return self.layout.grants(consumer)

    def bucket_key(self, consumer: str) -> str:
        return self.layout.bucket(consumer)

    # -- consume path ----------------------------------------------------------------------
    async def choose(
        self,
        consumer: str,
        client_id: str,
        topic: str,
        watermarks: dict[str, tuple[int, int]] | MarkLog,
        *,
        address: str,
        default_timeout_ms: int,
        default_start: str,
        client_idle_ms: int,
        max_messages: int = 1 << 30,
        open_mode: bool = True,
        credential: Credential | None = None,
        skip: set[str] | frozenset[str] = frozenset(),
        restore: bool = False,
        now: int | None = None,
        registered_as: str = "",
        settings_lost: Callable[[], Awaitable[bool]] | None = None,
    ) -> Lock | NoQueue | Paused | Refused | RateLimited | NeedsRestore:
        """Check the caller, then lock the free queue with the largest backlog (ties: least
        recently used). ``credential`` None means auth is off. ``restore``: a cluster-mode
        queue with no committed offset answers :class:`NeedsRestore` (never given one here).
        ``registered_as``: the topic a registration must name, when ``topic`` is the
        consumer's retry topic for it.

        ``watermarks``: a :class:`MarkLog` (the process's copy of the topic's watermarks with
        its history) lets a hash that absorbed an earlier version of it get only the queues that
        changed since, and choose.lua pick from its indexes in constant time; a plain dict is
        sent whole (the scan of every queue).

        ``settings_lost``: asked before a consumer's shard count is taken to have dropped (its
        settings may be missing because Redis lost them); True when they were just restored
        (then the count is read again)."""
        cred = credential or NO_CREDENTIAL
        clock = now is None  # the time is ours to take (again after a wait: _choose_in)
        now = now or now_ms()
        head: list[Any] = [topic, now, default_timeout_ms, default_start, address,
                           client_id, client_idle_ms, f",{','.join(skip)}," if skip else "",
                           max_messages, int(open_mode), int(credential is not None),
                           cred.key_id, cred.sha256, int(restore), registered_as or topic]
        shards = await self.shards.get(consumer)
        for _ in range(RESHARD_TRIES):
            got = await self._walk(consumer, client_id, topic, watermarks, head, now, shards,
                                   clock)
            if not isinstance(got, _Reshard):
                return got
            if got.shards < shards and settings_lost is not None and await settings_lost():
                shards = await self.shards.read(consumer)
                continue
            shards = got.shards  # a stale count: the script told the real one
            self.shards.set(consumer, shards)
        raise RuntimeError(f"consumer {consumer!r}: its shard count changed {RESHARD_TRIES} "
                           "times during one choice")

    async def _walk(
        self, consumer: str, client_id: str, topic: str,
        watermarks: dict[str, tuple[int, int]] | MarkLog, head: list[Any], now: int, shards: int,
        clock: bool,
    ) -> Lock | NoQueue | Paused | Refused | RateLimited | NeedsRestore | _Reshard:
        """Choose in the consumer's shards (store/shards.py): the one shard of a broadcast
        clientId; in cluster mode each in turn from a round-robin start, until one locks a
        queue. "The most backlog" is the most in the first shard that has work."""
        if shards == 1 or client_id:
            name = shard_name(consumer, shard_of(client_id, shards), shards)
            return await self._choose_in(name, topic, watermarks, head, now, shards, None, clock)
        turn = self._turns.get(consumer, 0)
        if len(self._turns) >= TURNS_KEPT:
            self._turns.clear()
        self._turns[consumer] = turn + 1
        wakes: list[int] = []
        limited: list[int] = []
        for i in range(shards):
            k = (turn + i) % shards
            got = await self._choose_in(shard_name(consumer, k, shards), topic, watermarks, head,
                                        now, shards, k, clock)
            if isinstance(got, NoQueue):
                if got.wake_ms >= 0:
                    wakes.append(got.wake_ms)
            elif isinstance(got, RateLimited):  # each shard has a bucket of rate / shards
                limited.append(got.retry_after_ms)
            else:
                return got
        if limited:
            return RateLimited(min(limited))
        return NoQueue(min(wakes, default=-1))

    async def _choose_in(
        self, name: str, topic: str, watermarks: dict[str, tuple[int, int]] | MarkLog,
        head: list[Any], now: int, shards: int, k: int | None, clock: bool,
    ) -> Lock | NoQueue | Paused | Refused | RateLimited | NeedsRestore | _Reshard:
        """choose.lua on one shard's keys (``name``: see shards.shard_name); ``k``: send only
        the queues of shard k (None: every queue). ``clock``: ``now`` is read again after a wait
        for another request's full call (the lock's time stamp)."""
        client_id = head[5]
        hkey = self.queues_key(name, client_id)
        keys = [hkey, self.config_key(name), self.clients_key(name),
                self.grants_key(name), self.bucket_key(name)]
        log = watermarks if isinstance(watermarks, MarkLog) else None
        slot = (hkey, topic, log.source) if log is not None else None
        since = self._absorbed.get(slot) if slot is not None else None
        first = None
        while slot is not None and since is None:
            # One full request at a time per hash and copy: others that come meanwhile wait for
            # it and then send only what changed, or (it was answered before the hash took the
            # watermarks: a restore first) the next of them sends all (16 consumers starting at
            # once on 4,096 partitions each sent every queue: 16 scans of 16 ms).
            running = self._first.get(slot)
            if running is None:
                first = self._first[slot] = asyncio.get_running_loop().create_future()
                break
            await asyncio.shield(running)
            since = self._absorbed.get(slot)
            if clock:
                now = now_ms()
                head = [head[0], now, *head[2:]]
        try:
            return await self._choose_with(keys, head, watermarks, slot, since, now, shards, k)
        finally:
            if first is not None:
                del self._first[slot]  # type: ignore[arg-type]
                first.set_result(None)

    async def _choose_with(
        self, keys: list[str], head: list[Any], watermarks: dict[str, tuple[int, int]] | MarkLog,
        slot: tuple[str, str, str] | None, since: int | None, now: int, shards: int,
        k: int | None,
    ) -> Lock | NoQueue | Paused | Refused | RateLimited | NeedsRestore | _Reshard:
        """choose.lua with only the changes since ``since`` (the version of ``watermarks`` the
        hash absorbed, None: unknown), or with every queue when that cannot be served; ``k``:
        of shard k's queues only."""
        log = watermarks if isinstance(watermarks, MarkLog) else None
        queues = watermarks.queues if isinstance(watermarks, MarkLog) else watermarks
        version = log.version if log is not None else 0
        delta = log.changes_since(since) if log is not None and since is not None else None
        if delta is not None:
            r = await self._choose(keys=keys, args=self._choose_args(
                head, "delta", log, since or 0, version, shards,
                delta if k is None else part(delta, k, shards)))
            if Chosen(int(r[0])) is Chosen.SEND_ALL:
                delta = None
        if delta is None:
            r = await self._choose(keys=keys, args=self._choose_args(
                head, "full", log, 0, version, shards,
                queues if k is None else part(queues, k, shards)))
        if slot is not None and Chosen(int(r[0])) in _ABSORBS:
            self._absorbed[slot] = version
            self._absorbed.move_to_end(slot)
            if len(self._absorbed) > ABSORBED_ENTRIES:
                self._absorbed.popitem(last=False)
        kind = Chosen(int(r[0]))
        if kind is Chosen.LOCKED:
            return Lock(text(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]),
                        bool(int(r[8])), int(r[9]), now)
        if kind is Chosen.NO_QUEUE:
            return NoQueue(int(r[1]))
        if kind is Chosen.PAUSED:
            return Paused()
        if kind is Chosen.REFUSED:
            return Refused(Refusal(text(r[1])))
        if kind is Chosen.NEEDS_RESTORE:
            return NeedsRestore(text(r[1]))
        if kind is Chosen.RESHARD:
            return _Reshard(int(r[1]))
        return RateLimited(int(r[1]))

    def _choose_args(self, head: list[Any], mode: str, log: MarkLog | None, since: int,
                     version: int, shards: int, queues: dict[str, tuple[int, int]]) -> list[Any]:
        args = [*head, mode, log.source if log is not None else "", since, version,
                self.index_rebuild_ms, shards]
        for q, (lo, hi) in queues.items():
            args += (q, lo, hi)
        return args

    # -- offset checkpoints in the broker (core/checkpoint.py) ----------------------------------
    async def restore(self, consumer: str, topic: str, offsets: dict[str, int],
                      redeliver_below: dict[str, int] | None = None) -> int:
        """Seed the cluster-mode queues of ``topic`` that have no committed offset with the
        positions the broker's checkpoint holds (``redeliver_below``: per queue, batches below
        this offset are flagged redelivered); how many were seeded."""
        below = redeliver_below or {}
        seeded = 0
        for name, mine in await self._by_shard(consumer, offsets):
            if not mine:
                continue
            args: list[Any] = [topic]
            for q, off in mine.items():
                args += (q, off, below.get(q, 0))
            seeded += int(await self._restore(keys=[self.queues_key(name)], args=args))
        return seeded

    async def note_starts(self, consumer: str, topic: str, offsets: dict[str, int]) -> None:
        """Note the start positions a restore is about to write to the broker's group (the
        queue's ``sta``), so a concurrent restore on another node that reads them back does not
        take them for a checkpoint of a lost Redis (restore.lua)."""
        for name, mine in await self._by_shard(consumer, offsets):
            if mine:
                await self.redis.hset(self.queues_key(name), mapping={
                    queue_field(topic, q, "sta"): off for q, off in mine.items()})

    async def mark_checkpointed(self, consumer: str, topic: str, offsets: dict[str, int]) -> None:
        """Remember what the broker now holds, so the next round sends only what moved."""
        for name, mine in await self._by_shard(consumer, offsets):
            if mine:
                await self.redis.hset(self.queues_key(name), mapping={
                    queue_field(topic, q, "ckp"): off for q, off in mine.items()})

    async def take_checkpoint_lease(self, node: str, ttl_ms: int, full: bool = False) -> bool:
        """This node checkpoints this tick, or (``full``) makes this interval's full round
        (``SET NX PX``: one node at a time)."""
        key = self.layout.checkpoint_lease("full" if full else "lease")
        return bool(await self.redis.set(key, node, nx=True, px=ttl_ms))

    async def ack(
        self, consumer: str, client_id: str, topic: str, queue: str, offset: int, next_offset: int,
        token: int, *, default_timeout_ms: int, high_watermark: int = -1,
        credential: Credential | None = None, now: int | None = None, check_only: bool = False,
    ) -> AckResult:
        """Commit the batch if its lock token and offsets still hold. ``check_only``: decide,
        but commit nothing (``committed`` then means "an ack would commit now")."""
        cred = credential or NO_CREDENTIAL
        args: list[str | int] = [f"{topic}:{queue}:", offset, next_offset, token, now or now_ms(),
                                 default_timeout_ms, high_watermark, int(credential is not None),
                                 cred.key_id, cred.sha256, int(check_only)]

        async def call(name: str) -> AckResult:
            keys = [self.queues_key(name, client_id), self.config_key(name), self.grants_key(name)]
            r = await self._ack(keys=keys, args=args)
            return AckResult(AckOutcome(text(r[0])), int(r[1]), LockState(text(r[2])))
        return await self._routed(consumer, client_id or queue, call,
                                  lambda r: r.result is AckOutcome.UNKNOWN)

    async def ack_instance(self, consumer: str, name: str, ttl_ms: int, *, default_timeout_ms: int,
                           credential: Credential | None = None,
                           now: int | None = None) -> list[PendingAck] | None:
        """Commit every pending batch of the REST v2 instance ``name`` (ack.lua's rule for each)
        and drop them, in one script call (lua/instance_commit.lua); None if the key may not
        consume as ``consumer``. Raises :class:`InstanceGone`."""
        cred = credential or NO_CREDENTIAL
        k = self.layout
        if await self.shards.get(consumer) > 1:  # core/instances.py refuses such instances
            raise InstanceGone(name)
        r = await self._ack_instance(
            keys=[k.instance(consumer, name), k.queues(consumer), k.config(consumer),
                  k.grants(consumer)],
            args=[ttl_ms, now or now_ms(), default_timeout_ms, int(credential is not None),
                  cred.key_id, cred.sha256])
        head = text(r[0])
        if head == "gone":
            raise InstanceGone(name)
        if head == "unauthorized":
            return None
        return [PendingAck(text(r[i]), text(r[i + 1]), text(r[i + 2]), int(r[i + 3]),
                           None if text(r[i + 4]) == "legacy" else
                           AckResult(AckOutcome(text(r[i + 4])), int(r[i + 5]),
                                     LockState(text(r[i + 6]))))
                for i in range(1, len(r), 7)]

    async def unlock(
        self, consumer: str, client_id: str, topic: str, queue: str, token: int,
        high_watermark: int = -1, credential: Credential | None = None, *,
        handed_out_to: int = -1,
    ) -> UnlockResult:
        """Free the queue for the next fetch. ``handed_out_to``: the end of the batch the caller
        received under this lock (its next offset), so that batch comes back flagged
        ``redelivered``; -1 when nothing was handed out (a read that failed or was empty)."""
        cred = credential or NO_CREDENTIAL

        async def call(name: str) -> UnlockResult:
            r = await self._unlock(keys=[self.queues_key(name, client_id), self.grants_key(name)],
                                   args=[f"{topic}:{queue}:", token, high_watermark,
                                         int(credential is not None), cred.key_id, cred.sha256,
                                         handed_out_to])
            return UnlockResult(UnlockOutcome(text(r[0])), int(r[1]))
        return await self._routed(consumer, client_id or queue, call,
                                  lambda r: r.result is UnlockOutcome.UNKNOWN)

    async def handed_out(self, consumer: str, client_id: str, topic: str, queue: str, token: int,
                         end: int) -> None:
        """The batch locked with ``token`` ends at ``end``, further than its start plus the
        records it was allowed (lua/handed.lua says why that matters)."""
        name = await self._shard(consumer, client_id or queue)
        await self._handed(keys=[self.queues_key(name, client_id)],
                           args=[f"{topic}:{queue}:", token, end])

    async def extend(
        self, consumer: str, client_id: str, topic: str, queue: str, offset: int, next_offset: int,
        token: int, *, default_timeout_ms: int, credential: Credential | None = None,
        now: int | None = None,
    ) -> ExtendResult:
        """Start the batch's lock timeout again if its lock token and offsets still hold."""
        cred = credential or NO_CREDENTIAL
        args: list[str | int] = [f"{topic}:{queue}:", offset, next_offset, token, now or now_ms(),
                                 default_timeout_ms, int(credential is not None), cred.key_id,
                                 cred.sha256]

        async def call(name: str) -> ExtendResult:
            keys = [self.queues_key(name, client_id), self.config_key(name), self.grants_key(name)]
            r = await self._extend(keys=keys, args=args)
            return ExtendResult(ExtendOutcome(text(r[0])), int(r[1]), int(r[2]))
        return await self._routed(consumer, client_id or queue, call,
                                  lambda r: r.result is ExtendOutcome.UNKNOWN)

    async def mark_seen(self, consumer: str) -> None:
        """List a consumer that fetched (each process re-adds its consumers once a minute), for
        the all-consumer views and alert thresholds."""
        await self.registry.mark_seen(consumer, now_ms())

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def refund(self, consumer: str, tokens: int, *, client_id: str = "",
                     queue: str = "") -> int:
        """Give ``tokens`` back to the rate-limit bucket that paid for a batch of ``queue`` (read
        short of what choose.lua charged): the bucket of the queue's shard (or the clientId's).
        Returns the bucket's tokens, -1 if it has no limit (any more)."""
        name = await self._shard(consumer, client_id or queue)
        return int(await self._refund(keys=[self.bucket_key(name), self.config_key(name)],
                                      args=[tokens]))

    async def reset(self, consumer: str, client_id: str, topic: str, targets: dict[str, int],
                    client_idle_ms: int = 0) -> list[tuple[str, int, int]]:
        """Set committed offsets (queue -> offset); returns (queue, from, to) per queue. A
        clientId's hash that has no expiry (the reset created it) gets ``client_idle_ms``, as
        choose.lua gives every polled one (0: none), in the same script call."""
        out: list[tuple[str, int, int]] = []
        for name, mine in await self._by_shard(consumer, targets, client_id):
            if not mine:
                continue
            args: list[Any] = [topic, client_idle_ms if client_id else 0]
            for q, off in mine.items():
                args += (q, off)
            r = await self._reset(keys=[self.queues_key(name, client_id)], args=args)
            out += [(text(r[i]), int(r[i + 1]), int(r[i + 2])) for i in range(0, len(r), 3)]
        return out

    async def produce_check(self, credential: Credential | None, open_mode: bool, producer: str,
                            topic: str) -> tuple[ProduceVerdict, str]:
        """May this caller produce to ``topic``? Returns (verdict, the producer it is checked
        as: the one named, or the key's only one); see produce_check.lua."""
        cred = credential or NO_CREDENTIAL
        r = await self._produce_check(
            keys=[self.layout.registry("keys"), self.layout.registry("producers")],
            args=[int(credential is not None), cred.key_id, cred.sha256, int(open_mode), producer, topic])
        return ProduceVerdict(text(r[0])), text(r[1])

    # -- broker watermarks shared by all nodes ----------------------------------------------
    async def read_watermarks(
        self, topic: str, refresh_ms: int, node_id: str, have: SharedCopy | None = None,
    ) -> tuple[bool, SharedCopy, int]:
        """Return (this node got the refresh lease, the shared copy, its age-stamp ms). ``have``:
        the copy this process read before; only what moved since is read (a new copy is
        returned, ``have`` is left as it was)."""
        keys = [self.layout.watermarks(topic), self.layout.watermark_lease(topic),
                self.layout.watermark_changes(topic)]
        known = have.version if have is not None and have.version is not None else ""
        r = await self._wm_get(keys=keys, args=[now_ms(), refresh_ms, node_id, known])
        lease, kind, version = bool(int(r[0])), text(r[1]), text(r[2])
        ver = int(version) if version else None
        if kind == "delta" and have is not None:
            queues = dict(have.queues)
            listed = text(r[4])
            if listed:
                queues = {q: queues.get(q, (0, 0)) for q in filter(None, listed.split(","))}
            for i in range(5, len(r), 3):
                q = text(r[i])
                if q in queues:
                    queues[q] = (int(r[i + 1]), int(r[i + 2]))
            return lease, SharedCopy(ver, queues), int(r[3])
        flat = r[3]
        data = {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat), 2)}
        return lease, SharedCopy(ver, _parse_watermarks(data)), int(data.get("ts", 0))

    async def shared_watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        """The last watermarks any node listed for ``topic`` (no lease, for views)."""
        raw = await self.redis.hgetall(self.layout.watermarks(topic))
        return _parse_watermarks(text_dict(raw))

    async def write_watermarks(self, topic: str, wm: dict[str, tuple[int, int]],
                               stored: SharedCopy | None = None) -> SharedCopy:
        """Store ``wm`` (each value only moves forward) and return the copy as it now is.
        ``stored``: the copy as just read from Redis; only queues ahead of it are sent (writing
        all 4,096 queues of a topic cost 9.8 ms of Redis every refresh interval, 200 ms by
        default, whether anything moved or not), and when no other write came between, the
        result carries the copy's new version (else None: the next read is a whole one)."""
        have = stored.queues if stored is not None else {}
        args: list[Any] = [now_ms(), ",".join(wm)]
        for q, (lo, hi) in wm.items():
            old = have.get(q)
            if old is None or lo > old[0] or hi > old[1]:
                args += (q, lo, hi)
        before, after = await self._wm_put(keys=[self.layout.watermarks(topic),
                                                 self.layout.watermark_changes(topic)], args=args)
        merged = {q: (max(lo, have.get(q, (0, 0))[0]), max(hi, have.get(q, (0, 0))[1]))
                  for q, (lo, hi) in wm.items()}
        known = stored is not None and stored.version is not None \
            and text(before) == str(stored.version) and bool(text(after))
        return SharedCopy(int(text(after)) if known else None, merged)

    # -- shards (store/shards.py) -----------------------------------------------------------------
    async def _shard(self, consumer: str, by: str) -> str:
        """The shard name holding queue or clientId ``by``."""
        shards = await self.shards.get(consumer)
        return shard_name(consumer, shard_of(by, shards), shards)

    async def _routed(self, consumer: str, by: str, call: Callable[[str], Awaitable[R]],
                      unknown: Callable[[R], bool]) -> R:
        """``call`` on the shard of ``by``; when the script found no such queue there and the
        consumer's shard count was stale (changed since this process read it), again on the
        right shard."""
        shards = await self.shards.get(consumer)
        got = await call(shard_name(consumer, shard_of(by, shards), shards))
        if unknown(got) and await self.shards.read(consumer) != shards:
            got = await call(await self._shard(consumer, by))
        return got

    async def _by_shard(self, consumer: str, queues: dict[str, V],
                        client_id: str = "") -> list[tuple[str, dict[str, V]]]:
        """``queues`` split by the shard holding each: [(shard name, its part)] (a clientId's
        queues are all in its shard)."""
        shards = await self.shards.get(consumer)
        if shards == 1 or client_id:
            return [(shard_name(consumer, shard_of(client_id, shards), shards), dict(queues))]
        return [(shard_name(consumer, k, shards), part(queues, k, shards)) for k in range(shards)]

    # -- consumer settings and views ------------------------------------------------------------
    async def get_config(self, consumer: str) -> dict[str, str]:
        return await self.registry.config(consumer)

    async def set_config(self, consumer: str, values: dict[str, str | int]) -> None:
        if values:
            await self.redis.hset(self.config_key(consumer), mapping=fields(values))
            await self.registry.mirror(consumer)
            await self.registry.wrote("consumer", consumer)

    async def queue_states(self, consumer: str, client_id: str = "") -> list[QueueState]:
        """The consumer's queues (of every shard), or a clientId's."""
        shards = await self.shards.get(consumer)
        if client_id:
            name = shard_name(consumer, shard_of(client_id, shards), shards)
            return parse_queue_hash(text_dict(await self.redis.hgetall(self.queues_key(name, client_id))))
        out: list[QueueState] = []
        for k in range(shards):
            raw = await self.redis.hgetall(self.queues_key(shard_name(consumer, k, shards)))
            out += owned(parse_queue_hash(text_dict(raw)), k, shards)
        return out

    async def has_offsets(self, consumer: str) -> bool:
        """Whether any shard of the consumer holds offsets (a queue hash or a clientId)."""
        shards = await self.shards.read(consumer)
        for k in range(shards):
            name = shard_name(consumer, k, shards)
            if await self.redis.exists(self.queues_key(name), self.clients_key(name)):
                return True
        return False

    async def clients(self, consumer: str) -> list[tuple[str, int]]:
        """Broadcast clientIds (of every shard) and when each was last seen (ms)."""
        out: list[tuple[str, int]] = []
        shards = await self.shards.get(consumer)
        for k in range(shards):
            raw = cast("list[tuple[bytes | str, float]]", await self.redis.zrange(
                self.clients_key(shard_name(consumer, k, shards)), 0, -1, withscores=True))
            out += [(text(m), int(s)) for m, s in raw]
        return out

    async def read_consumers(self, consumers: list[str]) -> list[ConsumerRead]:
        """Many consumers' config, queues and clientIds in two pipelined round trips (views.py)."""
        return await read_consumers(self.redis, self.layout, consumers)


#: Replies after which the hash holds every watermark of the copy's version sent (a refusal,
#: pause or rate limit returns before the watermarks are applied; a restore request before
#: they all are).
_ABSORBS = frozenset({Chosen.LOCKED, Chosen.NO_QUEUE})


def _parse_watermarks(data: dict[str, str]) -> dict[str, tuple[int, int]]:
    """``{queue: (lo, hi)}`` from a watermark hash (``queues``, ``<q>:lo``, ``<q>:hi``)."""
    return {q: (int(data.get(f"{q}:lo", 0)), int(data.get(f"{q}:hi", 0)))
            for q in filter(None, data.get("queues", "").split(","))}
