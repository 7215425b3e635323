"""Offset store: every consumer's queue offsets, locks and access times, held in Redis.

Layout (``P`` is the key prefix, ``G`` the group; ``{...}`` is a Redis Cluster hash tag,
so all of one group's keys live in one slot and its scripts run on one node):

=========================  ======  ====================================================
``P:{G}:q``                hash    cluster-mode queues: ``topic:queue:max|com|lock|tok|acc|addr``
``P:{G}:q:<clientId>``     hash    the same, one per broadcast clientId (expires when idle)
``P:{G}:clients``          zset    broadcast clientIds scored by last-seen time (ms)
``P:{G}:cfg``              hash    the consumer's registration and settings (registry.py)
``P:{G}:auth``             hash    API keys that may consume as G: key id -> sha256 of the key
``P:{G}:rl``               hash    rate-limit token bucket: ``tokens``, ``ts``
``P:{wm:<topic>}``         hash    broker watermarks ``queue:lo|hi``, ``queues``, ``ts``
``P:{wm:<topic>}:lease``   string  who refreshes the watermarks this interval
``P:{reg}:consumers``      set     registered consumer names
``P:{reg}:seen``           set     unregistered consumer names served in open mode
``P:{reg}:producers``      hash    producer name -> JSON registration (topics)
``P:{reg}:keys``           hash    API key id -> JSON record (sha256, name, grants)
=========================  ======  ====================================================

Choose+lock, ack and unlock are each exactly one Lua script call, so no decision is
ever made on a value read earlier from Python; the API-key check, the registration check
and the rate-limit token bucket happen inside those same calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from importlib import resources
from typing import Any, NamedTuple

from redis.asyncio import Redis

_LUA = resources.files("gateway.store") / "lua"
_FIELDS = ("max", "com", "lock", "tok", "acc", "addr")


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


@dataclass(frozen=True, slots=True)
class Refused:
    """The caller may not consume here: ``unauthorized``, ``unregistered``, ``topic_not_allowed``,
    ``client_id_required`` or ``client_id_not_allowed``."""

    reason: str


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


class AckOutcome(str, Enum):
    """What ack.lua decided (``unauthorized`` never leaves the core: it becomes an error)."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"
    LOCK_LOST = "lock_lost"  # another fetch took the queue
    OFFSET_RESET = "offset_reset"  # an operator reset the queue after the fetch
    OFFSET_MISMATCH = "offset_mismatch"
    UNKNOWN = "unknown"  # no such queue for this consumer
    UNAUTHORIZED = "unauthorized"


class UnlockOutcome(str, Enum):
    UNLOCKED = "unlocked"
    NOT_LOCKED = "not_locked"
    LOCK_LOST = "lock_lost"
    UNKNOWN = "unknown"
    UNAUTHORIZED = "unauthorized"


@dataclass(frozen=True, slots=True)
class AckResult:
    result: AckOutcome
    committed: int
    lock_state: str  # for committed: held | expired | released


class UnlockResult(NamedTuple):
    result: UnlockOutcome
    committed: int


@dataclass(frozen=True, slots=True)
class QueueState:
    topic: str
    queue: str
    max_offset: int
    committed: int
    lock_ms: int
    token: int
    access_ms: int
    address: str


class OffsetStore:
    def __init__(self, redis: Redis, prefix: str = "mqgw") -> None:
        self.redis = redis
        self.prefix = prefix
        load = lambda name: redis.register_script((_LUA / f"{name}.lua").read_text())  # noqa: E731
        self._choose = load("choose")
        self._ack = load("ack")
        self._unlock = load("unlock")
        self._wm_get = load("watermarks")
        self._wm_put = load("watermarks_put")
        self._reset = load("reset")
        self._produce_check = load("produce_check")
        self._refund = load("refund")

    # -- key names -------------------------------------------------------------------------
    def queues_key(self, group: str, client_id: str = "") -> str:
        base = f"{self.prefix}:{{{group}}}:q"
        return f"{base}:{client_id}" if client_id else base

    def config_key(self, group: str) -> str:
        return f"{self.prefix}:{{{group}}}:cfg"

    def clients_key(self, group: str) -> str:
        return f"{self.prefix}:{{{group}}}:clients"

    def grants_key(self, group: str) -> str:
        return f"{self.prefix}:{{{group}}}:auth"

    def bucket_key(self, group: str) -> str:
        return f"{self.prefix}:{{{group}}}:rl"

    def registry_key(self, what: str) -> str:
        """``consumers``, ``seen``, ``producers`` or ``keys``: one slot for the whole registry."""
        return f"{self.prefix}:{{reg}}:{what}"

    def watermark_keys(self, topic: str) -> tuple[str, str]:
        base = f"{self.prefix}:{{wm:{topic}}}"
        return base, f"{base}:lease"

    # -- consume path ----------------------------------------------------------------------
    async def choose(
        self,
        group: str,
        client_id: str,
        topic: str,
        watermarks: dict[str, tuple[int, int]],
        *,
        address: str,
        default_timeout_ms: int,
        default_start: str,
        client_idle_ms: int,
        max_messages: int = 1 << 30,
        open_mode: bool = True,
        credential: Credential | None = None,
        skip: set[str] | frozenset[str] = frozenset(),
        now: int | None = None,
    ) -> Lock | NoQueue | Paused | Refused | RateLimited:
        """Check the caller, then lock the free queue with the largest backlog (ties: least
        recently used). ``credential`` None means auth is off."""
        cred = credential or NO_CREDENTIAL
        args: list[Any] = [topic, now or now_ms(), default_timeout_ms, default_start, address,
                           client_id, client_idle_ms, f",{','.join(skip)}," if skip else "",
                           max_messages, int(open_mode), int(credential is not None),
                           cred.key_id, cred.sha256]
        for q, (lo, hi) in watermarks.items():
            args += (q, lo, hi)
        keys = [self.queues_key(group, client_id), self.config_key(group), self.clients_key(group),
                self.grants_key(group), self.bucket_key(group)]
        r = await self._choose(keys=keys, args=args)
        kind = int(r[0])
        if kind == 1:
            return Lock(_s(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]),
                        bool(int(r[8])))
        if kind == 0:
            return NoQueue(int(r[1]))
        if kind == 2:
            return Paused()
        if kind == 3:
            return Refused(_s(r[1]))
        return RateLimited(int(r[1]))

    async def ack(
        self, group: str, client_id: str, topic: str, queue: str, offset: int, next_offset: int,
        token: int, *, default_timeout_ms: int, high_watermark: int = -1,
        credential: Credential | None = None, now: int | None = None,
    ) -> AckResult:
        cred = credential or NO_CREDENTIAL
        keys = [self.queues_key(group, client_id), self.config_key(group), self.grants_key(group)]
        args = [f"{topic}:{queue}:", offset, next_offset, token, now or now_ms(),
                default_timeout_ms, high_watermark, int(credential is not None), cred.key_id,
                cred.sha256]
        r = await self._ack(keys=keys, args=args)
        return AckResult(AckOutcome(_s(r[0])), int(r[1]), _s(r[2]))

    async def unlock(
        self, group: str, client_id: str, topic: str, queue: str, token: int,
        high_watermark: int = -1, credential: Credential | None = None,
    ) -> tuple[str, int]:
        cred = credential or NO_CREDENTIAL
        r = await self._unlock(keys=[self.queues_key(group, client_id), self.grants_key(group)],
                               args=[f"{topic}:{queue}:", token, high_watermark,
                                     int(credential is not None), cred.key_id, cred.sha256])
        return UnlockResult(UnlockOutcome(_s(r[0])), int(r[1]))

    async def mark_seen(self, group: str) -> None:
        """List an unregistered consumer served in open mode (for the all-consumer views)."""
        await self.redis.sadd(self.registry_key("seen"), group)

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def refund(self, group: str, tokens: int) -> int:
        """Give ``tokens`` back to the consumer's rate-limit bucket (a batch read short of what
        choose.lua charged); returns the bucket's tokens, -1 if it has no limit (any more)."""
        return int(await self._refund(keys=[self.bucket_key(group), self.config_key(group)],
                                      args=[tokens]))

    async def reset(self, group: str, client_id: str, topic: str,
                    targets: dict[str, int]) -> list[tuple[str, int, int]]:
        """Set committed offsets (queue -> offset); returns (queue, from, to) per queue."""
        if not targets:
            return []
        args: list[Any] = [topic]
        for q, off in targets.items():
            args += (q, off)
        r = await self._reset(keys=[self.queues_key(group, client_id)], args=args)
        return [(_s(r[i]), int(r[i + 1]), int(r[i + 2])) for i in range(0, len(r), 3)]

    async def produce_check(self, credential: Credential | None, open_mode: bool, producer: str,
                            topic: str) -> tuple[str, str]:
        """May this caller produce to ``topic``? Returns (verdict, producer): see produce_check.lua."""
        cred = credential or NO_CREDENTIAL
        r = await self._produce_check(
            keys=[self.registry_key("keys"), self.registry_key("producers")],
            args=[int(credential is not None), cred.key_id, cred.sha256, int(open_mode), producer, topic])
        return _s(r[0]), _s(r[1])

    # -- broker watermarks shared by all nodes ----------------------------------------------
    async def read_watermarks(
        self, topic: str, refresh_ms: int, node_id: str
    ) -> tuple[bool, dict[str, tuple[int, int]], int]:
        """Return (this node got the refresh lease, watermarks, their age-stamp ms)."""
        data_key, lease_key = self.watermark_keys(topic)
        lease, flat = await self._wm_get(keys=[data_key, lease_key], args=[now_ms(), refresh_ms, node_id])
        fields = {_s(flat[i]): _s(flat[i + 1]) for i in range(0, len(flat), 2)}
        return bool(int(lease)), _parse_watermarks(fields), int(fields.get("ts", 0))

    async def shared_watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        """The last watermarks any node listed for ``topic`` (no lease, for views)."""
        raw = await self.redis.hgetall(self.watermark_keys(topic)[0])
        return _parse_watermarks({_s(k): _s(v) for k, v in raw.items()})

    async def write_watermarks(self, topic: str, wm: dict[str, tuple[int, int]]) -> None:
        args: list[Any] = [now_ms(), ",".join(wm)]
        for q, (lo, hi) in wm.items():
            args += (q, lo, hi)
        await self._wm_put(keys=[self.watermark_keys(topic)[0]], args=args)

    # -- consumer settings and views ------------------------------------------------------------
    async def get_config(self, group: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self.config_key(group))
        return {_s(k): _s(v) for k, v in raw.items()}

    async def set_config(self, group: str, values: dict[str, str | int]) -> None:
        if values:
            await self.redis.hset(self.config_key(group), mapping=values)

    async def queue_states(self, group: str, client_id: str = "") -> list[QueueState]:
        raw = await self.redis.hgetall(self.queues_key(group, client_id))
        return parse_queue_hash({_s(k): _s(v) for k, v in raw.items()})

    async def clients(self, group: str) -> list[tuple[str, int]]:
        raw = await self.redis.zrange(self.clients_key(group), 0, -1, withscores=True)
        return [(_s(m), int(s)) for m, s in raw]


def parse_queue_hash(fields: dict[str, str]) -> list[QueueState]:
    """Group ``topic:queue:attr`` fields into one :class:`QueueState` per queue."""
    grouped: dict[tuple[str, str], dict[str, str]] = {}
    for name, value in fields.items():
        head, _, attr = name.rpartition(":")
        topic, _, queue = head.rpartition(":")
        if attr in _FIELDS and topic:
            grouped.setdefault((topic, queue), {})[attr] = value
    out = []
    for (topic, queue), f in sorted(grouped.items(), key=lambda kv: (kv[0][0], _qsort(kv[0][1]))):
        out.append(QueueState(topic, queue, int(f.get("max", 0)), int(f.get("com", 0)),
                              int(f.get("lock", 0)), int(f.get("tok", 0)), int(f.get("acc", 0)),
                              f.get("addr", "")))
    return out


def _parse_watermarks(fields: dict[str, str]) -> dict[str, tuple[int, int]]:
    """``{queue: (lo, hi)}`` from a watermark hash (``queues``, ``<q>:lo``, ``<q>:hi``)."""
    return {q: (int(fields.get(f"{q}:lo", 0)), int(fields.get(f"{q}:hi", 0)))
            for q in filter(None, fields.get("queues", "").split(","))}


def _qsort(q: str) -> tuple[int, str]:
    return (int(q), "") if q.isdigit() else (1 << 62, q)


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


