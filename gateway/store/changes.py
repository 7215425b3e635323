"""Registry change notices, so that each process may cache produce verdicts (core/produce.py).

Every write that can change what ``produce_check.lua`` answers (an API key created or revoked, a
producer registered, changed or deleted) is followed by :meth:`RegistryChanges.announce`: one
script bumps ``P:{reg}:version`` and PUBLISHes it on the channel ``P:{reg}:changed``. Every
gateway process listens (:meth:`RegistryChanges.listen`), drops its cached verdicts when a notice
arrives, and acknowledges it (``SADD P:{reg}:acks:<version> <listener>``). ``announce`` returns
once as many listeners acknowledged as PUBLISH reached (or after ``ACK_WAIT_S``), so when the
admin API answers, the change applies to the next request on every node, as without a cache.

A listener whose connection drops reports "not live" and its process stops using its cache
until it has subscribed again; a cached verdict also expires on its own (core/produce.py), in
case a connection dies without anyone noticing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio import Redis

from . import scripts
from .connect import UNAVAILABLE
from .keys import KeyLayout

log = logging.getLogger("mqgw.registry")

#: How long a registry write waits for every listening process to acknowledge its notice.
ACK_WAIT_S = 2.0
#: An acknowledgement set outlives any writer that waits for it.
_ACK_TTL_MS = 60_000


class RegistryChanges:
    def __init__(self, redis: Redis, layout: KeyLayout) -> None:
        self._redis = redis
        self._keys = layout
        self._announce = scripts.register(redis, "registry_changed")

    @property
    def channel(self) -> str:
        return self._keys.registry("changed")

    async def announce(self) -> None:
        """Tell every process that produce verdicts changed; wait until they all know."""
        version, receivers = await self._announce(
            keys=[self._keys.registry("version")], args=[self.channel])
        ack_key = self._keys.registry_acks(int(version))
        deadline = asyncio.get_running_loop().time() + ACK_WAIT_S
        while int(await self._redis.scard(ack_key)) < int(receivers):
            if asyncio.get_running_loop().time() > deadline:
                log.warning("registry change %s: %s of %s gateway processes acknowledged within "
                            "%.0f s; the others' cached produce verdicts expire on their own",
                            version, await self._redis.scard(ack_key), receivers, ACK_WAIT_S)
                return
            await asyncio.sleep(0.002)

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
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                except Exception:  # noqa: BLE001 - the connection is gone anyway
                    pass
            await asyncio.sleep(0.5)
