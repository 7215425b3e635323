"""REST v2 consumer instances in Redis (what they are: core/instances.py).

One hash per instance, ``P:{G}:inst:<instance>`` (keys.py), under its consumer's hash tag: the
instance's settings and subscription (fields named by the core), and a field ``b:<requestId>``
per batch it fetched and has not yet committed or handed back (its value: :func:`pending`, what
``lua/instance_commit.lua`` acks it by, so that a commit of all is one script). Every
call that reads or changes it starts its expiry again (``instance_timeout_ms``), as the
Confluent REST Proxy destroys an instance idle for ``consumer.instance.timeout.ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import IntEnum

from redis.asyncio import Redis

from . import scripts
from .connect import text_dict
from .keys import KeyLayout

#: The field prefix of a pending batch.
BATCH = "b:"
#: The field of the settings' version: a new one at each change of the subscription, so that
#: a node deciding on a remembered copy of the settings learns that they changed.
VERSION = "v"


class Written(IntEnum):
    """What ``lua/instance.lua`` did."""

    NOT_FOUND = 0  # (create: one of that name exists already)
    DONE = 1
    STALE = 2  # the settings changed since the version given: nothing written


def pending(fetched_ms: int, topic: str, queue: str, offset: int, next_offset: int, token: int,
            high_watermark: int) -> str:
    """A pending batch's value (topic names and queue ids hold no space)."""
    return f"{fetched_ms} {topic} {queue} {offset} {next_offset} {token} {high_watermark}"


def fetched_ms(value: str) -> int:
    """When the pending batch of ``value`` (:func:`pending`) was fetched."""
    return int(value.split(" ", 1)[0])


class InstanceStore:
    def __init__(self, redis: Redis, layout: KeyLayout) -> None:
        self._redis = redis
        self._keys = layout
        self._write = scripts.register(redis, "instance")

    async def create(self, consumer: str, name: str, fields: Mapping[str, str],
                     ttl_ms: int) -> bool:
        """Make the instance with ``fields``; False if one of that name lives already."""
        return await self._call("create", consumer, name, ttl_ms, (), fields) == Written.DONE

    async def load(self, consumer: str, name: str, ttl_ms: int) -> dict[str, str] | None:
        """Its fields (and its life extended), None if there is none."""
        key = self._keys.instance(consumer, name)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(key)
            pipe.pexpire(key, ttl_ms)
            fields, _ = await pipe.execute()
        return text_dict(fields) or None

    async def update(self, consumer: str, name: str, ttl_ms: int, drop: Iterable[str] = (),
                     put: Mapping[str, str] | None = None, version: str = "",
                     max_pending: int = 0) -> Written:
        """Delete the fields ``drop`` and set ``put``, in one script call, if the instance
        lives and (``version``) its settings are still those of that version; beyond
        ``max_pending`` pending batches the oldest are dropped."""
        return await self._call("update", consumer, name, ttl_ms, tuple(drop), put or {},
                                version, max_pending)

    async def delete(self, consumer: str, name: str) -> bool:
        return bool(await self._redis.delete(self._keys.instance(consumer, name)))

    async def _call(self, mode: str, consumer: str, name: str, ttl_ms: int,
                    drop: tuple[str, ...], put: Mapping[str, str], version: str = "",
                    max_pending: int = 0) -> Written:
        args: list[str | int] = [mode, ttl_ms, version, max_pending, len(drop), *drop]
        for k, v in put.items():
            args += (k, v)
        return Written(int(await self._write(keys=[self._keys.instance(consumer, name)], args=args)))
