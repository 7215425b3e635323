"""Batched reads of many consumers at once, for the all-consumer views (backlog, alerts).

Two pipelined round trips whatever the number of consumers (in chunks of :data:`CHUNK`
commands): every consumer's config hash, cluster-mode queue hash and clientId set; then every
clientId's queue hash (and one more between them for the other shards of consumers that have
several: store/shards.py). Several slots in one pipeline are fine on Redis Cluster (redis-py splits
it by node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from .connect import text, text_dict
from .keys import KeyLayout
from .queues import QueueState, parse_queue_hash
from .shards import owned, parse_shards, shard_name, shard_of

#: Commands per pipeline round trip.
CHUNK = 500


@dataclass(frozen=True, slots=True)
class ConsumerRead:
    """One consumer's stored state."""

    consumer: str
    config: dict[str, str]
    queues: list[QueueState]  # cluster mode
    clients: list[tuple[str, int]]  # broadcast clientIds and when each was last seen (ms)
    client_queues: dict[str, list[QueueState]] = field(default_factory=dict)  # per clientId


async def read_consumers(redis: Redis, layout: KeyLayout, consumers: list[str]) -> list[ConsumerRead]:
    """The stored state of each of ``consumers``, in that order (a consumer with shards: of them
    all, merged; one more round trip for such consumers)."""
    first = await _pipelined(redis, [c for g in consumers for c in (
        _hgetall(layout.config(g)), _hgetall(layout.queues(g)), _zrange(layout.clients(g)))])
    configs = {g: text_dict(first[3 * i]) for i, g in enumerate(consumers)}
    shards = {g: parse_shards(configs[g].get("shards")) for g in consumers}
    queues = {g: owned(parse_queue_hash(text_dict(first[3 * i + 1])), 0, shards[g])
              for i, g in enumerate(consumers)}
    clients = {g: [(text(m), int(s)) for m, s in first[3 * i + 2]] for i, g in enumerate(consumers)}
    more = [(g, k) for g in consumers for k in range(1, shards[g])]
    rest = await _pipelined(redis, [c for g, k in more for c in (
        _hgetall(layout.queues(shard_name(g, k, shards[g]))),
        _zrange(layout.clients(shard_name(g, k, shards[g]))))])
    for i, (g, k) in enumerate(more):
        queues[g] += owned(parse_queue_hash(text_dict(rest[2 * i])), k, shards[g])
        clients[g] += [(text(m), int(s)) for m, s in rest[2 * i + 1]]
    pairs = [(g, c) for g in consumers for c, _ in clients[g]]
    hashes = await _pipelined(redis, [
        _hgetall(layout.queues(shard_name(g, shard_of(c, shards[g]), shards[g]), c))
        for g, c in pairs])
    per_client: dict[str, dict[str, list[QueueState]]] = {g: {} for g in consumers}
    for (g, c), h in zip(pairs, hashes, strict=True):
        per_client[g][c] = parse_queue_hash(text_dict(h))
    return [ConsumerRead(g, configs[g], queues[g], clients[g], per_client[g]) for g in consumers]


Command = Callable[[Any], Any]


def _hgetall(key: str) -> Command:
    return lambda pipe: pipe.hgetall(key)


def _zrange(key: str) -> Command:
    return lambda pipe: pipe.zrange(key, 0, -1, withscores=True)


async def _pipelined(redis: Redis, commands: list[Command]) -> list[Any]:
    """Run commands in non-transactional pipelines of :data:`CHUNK`."""
    out: list[Any] = []
    for i in range(0, len(commands), CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for command in commands[i:i + CHUNK]:
                command(pipe)
            out.extend(await pipe.execute())
    return out
