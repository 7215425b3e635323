"""One consumer over several Redis Cluster slots: which shard holds a queue or a clientId.

All of a consumer's keys share its hash tag ``{G}``, so one consumer group is one Redis core
whatever the size of the cluster (issue 35). A consumer with the setting ``shards`` = S > 1 keeps
its keys under S tags: shard 0 is ``{G}`` (exactly the layout of a consumer with one shard), shard
k a tag ``{G#k}`` or ``{G#k.j}`` (``#`` is not allowed in names: core/names.py; see
:func:`shard_name` for which). In cluster mode queue q lives in shard :func:`shard_of` (q); in
broadcast mode a clientId c's offsets live in shard :func:`shard_of` (c) (a clientId reads every
queue, so it stays in one shard and needs no walk).
Every shard holds a copy of the consumer's settings and grants, which its scripts read in their
own slot (store/registry.py writes them), with the rate limit divided by S: each shard has a
bucket of its own.

S is fixed while the consumer has offsets (core/registry.py refuses a change: moving queues
between slots cannot be atomic on a cluster), so a process caches it. choose.lua checks the
cached S against the shard's settings and answers the real one (``{7, S}``), so a stale cache
costs one retry; an ack routed by a stale S finds no lock and is retried after a fresh read.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache
from typing import TypeVar

from redis.asyncio import Redis
from redis.crc import key_slot

from .connect import text
from .keys import KeyLayout
from .queues import QueueState

#: The most shards a consumer may have (a fetch that finds nothing walks them all).
MAX_SHARDS = 16
#: Consumers whose shard count a process remembers (and shard names it keeps).
CACHED = 65_536
#: Redis Cluster's hash slots.
SLOTS = 16_384

V = TypeVar("V")


@lru_cache(maxsize=CACHED)
def shard_name(consumer: str, k: int, shards: int) -> str:
    """The name whose keys (``P:{<name>}:...``) are shard ``k`` of ``consumer``'s ``shards``.

    Shard 0 is the consumer's own name. Shard k is ``G#k`` or, the first that fits, ``G#k.j``
    (j = 1, 2, ...): one whose Redis Cluster slot lies in the k-th of ``shards`` equal slot
    ranges counted from shard 0's. A cluster whose primaries hold equal ranges of slots (what
    ``redis-cli --cluster create`` makes) then has shards on as many primaries as it can:
    names picked at random would put 3 shards on 3 primaries only 2 times in 9. About
    ``shards`` CRC16s per shard, once per process (cached)."""
    if k == 0:
        return consumer
    width = SLOTS / shards
    band = (int(key_slot(consumer.encode()) // width) + k) % shards
    lo, hi = band * width, (band + 1) * width
    j = 0
    while True:
        name = f"{consumer}#{k}" if j == 0 else f"{consumer}#{k}.{j}"
        if lo <= key_slot(name.encode()) < hi:
            return name
        j += 1


def shard_of(key: str, shards: int) -> int:
    """The shard of a queue id (cluster mode) or a clientId (broadcast mode). Numbered ids go
    round robin, so a topic's queues spread evenly: Kafka's partition ``"7"`` is 7 % S, and
    RocketMQ's ``"broker-a.7"`` is (crc32 of ``broker-a``) + 7, % S. Other ids by crc32 (a
    crc32 of every id put none of partitions 0-5 in shard 0 of 3)."""
    if shards <= 1:
        return 0
    if key.isdigit():
        return int(key) % shards
    head, _, tail = key.rpartition(".")
    if head and tail.isdigit():
        return (zlib.crc32(head.encode()) + int(tail)) % shards
    return zlib.crc32(key.encode()) % shards


def parse_shards(value: object) -> int:
    """A config hash's ``shards`` field as a count (missing or malformed: 1)."""
    try:
        n = int(text(value)) if value is not None else 1  # type: ignore[arg-type]
    except ValueError:
        return 1
    return n if 1 <= n <= MAX_SHARDS else 1


def part(items: Mapping[str, V], k: int, shards: int) -> dict[str, V]:
    """The entries of ``items`` (keyed by queue id) that shard ``k`` of ``shards`` holds."""
    if shards <= 1:
        return dict(items)
    return {q: v for q, v in items.items() if shard_of(q, shards) == k}


def owned(rows: list[QueueState], k: int, shards: int) -> list[QueueState]:
    """The rows of shard ``k``'s hash whose queue the shard holds: a hash may keep queues of
    another shard count (filed while Redis had lost the settings, before they were restored),
    which nothing reads."""
    return rows if shards <= 1 else [r for r in rows if shard_of(r.queue, shards) == k]


class ShardCounts:
    """Each consumer's shard count as this process last read it from the consumer's settings
    (bounded: least recently used out first)."""

    def __init__(self, redis: Redis, layout: KeyLayout, entries: int = CACHED) -> None:
        self._redis = redis
        self._layout = layout
        self._entries = entries
        self._known: OrderedDict[str, int] = OrderedDict()

    async def get(self, consumer: str) -> int:
        n = self._known.get(consumer)
        if n is None:
            return await self.read(consumer)
        self._known.move_to_end(consumer)
        return n

    async def read(self, consumer: str) -> int:
        """Read it again (and remember it)."""
        n = parse_shards(await self._redis.hget(self._layout.config(consumer), "shards"))
        self.set(consumer, n)
        return n

    def set(self, consumer: str, n: int) -> None:
        self._known[consumer] = n
        self._known.move_to_end(consumer)
        if len(self._known) > self._entries:
            self._known.popitem(last=False)
