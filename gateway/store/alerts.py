"""Backlog-alert state in Redis: the evaluation lease and lock, the per-consumer states and
gauges (key names: keys.py; the evaluation itself is ops/alerts.py).

The lease (``SET NX PX``) lets one node per interval evaluate; the lock serialises evaluations;
a commit replaces both hashes only while the lock is still held (``alerts_commit.lua``), and a
lease or lock is released only by its holder (``release.lua``). All alert keys share the
``{alerts}`` hash tag, so those scripts work on Redis Cluster.
"""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from . import scripts
from .connect import text
from .keys import AlertKey, KeyLayout


class AlertStore:
    def __init__(self, redis: Redis, layout: KeyLayout) -> None:
        self._redis = redis
        self._keys = layout
        self._commit = scripts.register(redis, "alerts_commit")
        self._release = scripts.register(redis, "release")

    def key(self, what: AlertKey) -> str:
        return self._keys.alert(what)

    async def take(self, what: AlertKey, token: str, ttl_ms: int) -> bool:
        """Take the ``lease`` or ``lock`` for ``ttl_ms`` unless someone holds it."""
        return bool(await self._redis.set(self._keys.alert(what), token, nx=True, px=ttl_ms))

    async def release(self, what: AlertKey, token: str) -> bool:
        """Give the ``lease`` or ``lock`` back if ``token`` still holds it."""
        return bool(int(await self._release(keys=[self._keys.alert(what)], args=[token])))

    async def states(self) -> dict[str, dict[str, Any]]:
        """consumer -> its last committed alert state."""
        raw = await self._redis.hgetall(self._keys.alert("state"))
        return {text(k): orjson.loads(v) for k, v in raw.items()}

    async def commit(self, token: str, now: int, states: dict[str, dict[str, Any]],
                     gauges: dict[str, dict[str, Any]]) -> bool:
        """Replace states and gauges and stamp ``evaluated`` if the lock still holds ``token``
        (one script call); False if the evaluation outlived its lock."""
        args: list[Any] = [token, now, len(states)]
        for name, st in states.items():
            args += (name, orjson.dumps(st))
        for name, g in gauges.items():
            args += (name, orjson.dumps(g))
        keys = [self._keys.alert(k) for k in ("lock", "state", "gauges", "evaluated")]
        return bool(int(await self._commit(keys=keys, args=args)))

    async def view(self) -> tuple[dict[str, dict[str, Any]], int | None]:
        """(states, time of the last evaluation or None), in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.alert("state"))
            pipe.get(self._keys.alert("evaluated"))
            raw, evaluated = await pipe.execute()
        return ({text(k): orjson.loads(v) for k, v in raw.items()},
                int(evaluated) if evaluated else None)

    async def gauges_and_states(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """(gauges, states) as of the last evaluation, in one round trip (for the metrics)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._keys.alert("gauges"))
            pipe.hgetall(self._keys.alert("state"))
            gauges, states = await pipe.execute()
        return ({text(k): orjson.loads(v) for k, v in gauges.items()},
                {text(k): orjson.loads(v) for k, v in states.items()})
