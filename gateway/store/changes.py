"""Registry change notices, so that each process may cache produce verdicts (core/produce.py).

Every write that can change what ``produce_check.lua`` answers (an API key created or revoked, a
producer registered, changed or deleted) is followed by :meth:`RegistryChanges.announce`: one
script bumps ``P:{reg}:version`` and PUBLISHes it on the channel ``P:{reg}:changed:db<N>``. Every
gateway process listens (:meth:`RegistryChanges.listen`), drops its cached verdicts when a notice
arrives, and acknowledges it (``SADD P:{reg}:acks:<version> <listener>``). ``announce`` returns
once as many listeners acknowledged as PUBLISH reached (or after ``ACK_WAIT_S``), so when the
admin API answers, the change applies to the next request on every node, as without a cache.

A listener whose connection drops reports "not live" and its process stops using its cache
until it has subscribed again; a cached verdict also expires on its own (core/produce.py), in
case a connection dies without anyone noticing.

The channel name carries the Redis database number as well as the prefix: pub/sub ignores
databases, so two deployments on one server with one prefix in databases 0 and 1 used to get
each other's notices. Each write then waited the full ``ACK_WAIT_S`` for processes that never
acknowledge in its database, and the other deployment's acknowledgements (same version number,
``SADD`` in its own database) could end its wait early (tests/system/test_notices.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from . import scripts
from .connect import UNAVAILABLE
from .keys import KeyLayout

log = logging.getLogger("mqgw.registry")

#: How long a registry write waits for every listening process to acknowledge its notice.
ACK_WAIT_S = 2.0
#: An acknowledgement set outlives any writer that waits for it.
_ACK_TTL_MS = 60_000


@dataclass(frozen=True, slots=True)
class Announced:
    """What :meth:`RegistryChanges.announce` saw: the notice's version, how many listening
    processes PUBLISH reached, and how many acknowledged before it returned."""

    version: int
    reached: int
    acknowledged: int


class RegistryChanges:
    def __init__(self, redis: Redis, layout: KeyLayout) -> None:
        self._redis = redis
        self._keys = layout
        self._announce = scripts.register(redis, "registry_changed")

    @property
    def channel(self) -> str:
        """Scoped by prefix and database: pub/sub is server-wide (keys.py)."""
        return self._keys.registry_changed()

    async def announce(self) -> Announced:
        """Tell every process that produce verdicts changed; wait until they all know."""
        raw_version, raw_reached = await self._announce(
            keys=[self._keys.registry("version")], args=[self.channel])
        version, reached = int(raw_version), int(raw_reached)
        ack_key = self._keys.registry_acks(version)
        deadline = asyncio.get_running_loop().time() + ACK_WAIT_S
        while (acked := int(await self._redis.scard(ack_key))) < reached:
            if asyncio.get_running_loop().time() > deadline:
                log.warning("registry change %s: %s of %s gateway processes acknowledged within "
                            "%.0f s; the others' cached produce verdicts expire on their own",
                            version, acked, reached, ACK_WAIT_S)
                break
            await asyncio.sleep(0.002)
        return Announced(version, reached, acked)

    async def listen(self, listener: str, on_change: Callable[[], None],
                     on_live: Callable[[bool], None]) -> None:
        """Run until cancelled: ``on_live(True)`` once subscribed, ``on_change()`` for each
        notice (then acknowledged), ``on_live(False)`` whenever the subscription is lost."""
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                async for msg in pubsub.listen():
                    if msg["type"] == "subscribe":
                        on_live(True)
                    elif msg["type"] == "message":
                        on_change()
                        ack_key = self._keys.registry_acks(int(msg["data"]))
                        async with self._redis.pipeline(transaction=False) as pipe:
                            pipe.sadd(ack_key, listener)
                            pipe.pexpire(ack_key, _ACK_TTL_MS)
                            await pipe.execute()
            except asyncio.CancelledError:
                raise
            except (*UNAVAILABLE, AttributeError, NotImplementedError) as e:  # type: ignore[misc]
                log.info("registry change notices unavailable (%r): produce verdicts are not "
                         "cached until they are back", e)
            finally:
                on_live(False)
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001 - the connection is gone anyway
                    pass
            await asyncio.sleep(0.5)
