"""The unit layer's fixtures: the gateway's real Lua scripts and core services in one process.

Redis is fakeredis with Lua (lupa), so every decision the store makes runs the scripts of
``gateway/store/lua/`` as a redis-server would; the broker is the in-package
:class:`~gateway.broker.memory.MemoryBroker`. Nothing starts a process or opens a socket, and
each test starts with an empty Redis (one ``FakeServer`` for the session, flushed before each
test), so no key prefix is needed.

Two workarounds for fakeredis, both confined to this folder:

- **No ``bit`` library.** fakeredis runs scripts on lupa's Lua 5.1, which lacks the LuaBitOp
  ``bit`` module Redis bundles; ``prelude.lua``'s constant-time digest comparison (every
  API-key check) calls ``bit.bor``/``bit.bxor``. ``lua/bit.lua`` here defines them in plain Lua,
  and fakeredis loads it as a module (``lua_modules``) found on ``LUA_PATH``, set below before
  any Lua runtime exists.
- **A clock the test moves.** Scripts take "now" from their caller (``OffsetStore`` calls
  ``now_ms()``) and, for rate-limit buckets and token seeds, from Redis ``TIME``, which
  fakeredis reads from ``time.time()``. The :func:`clock` fixture replaces both with one
  :class:`Clock` (and fakeredis' key expiry too), so lock expiry, bucket refills and idle
  clientIds happen when the test says, without sleeps. It patches fakeredis internals
  (``_socket._base.time``, ``commands_mixins.server_mixin.time``, as of fakeredis 2.41): a
  release that moves them makes ``monkeypatch.setattr`` fail loudly, not the clock drift.
"""

from __future__ import annotations

import os
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core.auth import Authorizer, KeyStore
from gateway.core.checkpoint import Checkpoints
from gateway.core.consume import ConsumeService
from gateway.core.fetch import Fetched, FetchParams
from gateway.core.registry import Registry
from gateway.core.requestid import RequestIdCodec
from gateway.core.watermarks import Watermarks
from gateway.store import OffsetStore

_LUA_DIR = Path(__file__).resolve().parent / "lua"
os.environ["LUA_PATH"] = f"{_LUA_DIR}/?.lua;;"  # read when fakeredis makes its Lua runtime

HMAC_KEY = "unit-test-hmac-key-0123456789"
#: Settings every unit test starts from: open, no auth, earliest, short timeouts, no
#: checkpoints (tests that want them pass ``checkpoint_interval_ms``).
BASE_SETTINGS: dict[str, Any] = dict(
    metadata_refresh_ms=5, start_position="earliest", gap_recheck_ms=0, open_mode=True,
    auth=False, checkpoint_interval_ms=0, consume_timeout_ms=1_000, hmac_key=HMAC_KEY)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """The wall clock plus a skew the test adds to with :meth:`advance`: both the store's
    ``now_ms`` and Redis ``TIME`` read it. Time still flows (watermark refreshes and long polls
    work as in production); a jump expires a lock or refills a bucket without a sleep."""

    def __init__(self) -> None:
        self.skew_ms = 0
        self.frozen: float | None = None

    def advance(self, ms: int) -> None:
        self.skew_ms += ms

    def freeze(self) -> None:
        """Stop the flow: from now on only :meth:`advance` moves the clock (for assertions on
        amounts that refill with time, such as rate-limit tokens)."""
        self.frozen = time.time()

    def time(self) -> float:  # what fakeredis' TIME command calls
        return (time.time() if self.frozen is None else self.frozen) + self.skew_ms / 1000

    def now_ms(self) -> int:
        return int(self.time() * 1000)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    from fakeredis._socket import _base
    from fakeredis.commands_mixins import server_mixin

    import gateway.store.offsets as offsets

    c = Clock()
    fake_time = types.SimpleNamespace(time=c.time)
    monkeypatch.setattr(offsets, "now_ms", c.now_ms)
    monkeypatch.setattr(server_mixin, "time", fake_time)  # TIME
    monkeypatch.setattr(_base, "time", fake_time)  # key expiry (PEXPIRE, SET PX)
    return c


@pytest.fixture(scope="session")
def redis_server() -> fakeredis.FakeServer:
    """One fake server for the session: its Lua runtime and compiled scripts are made once
    (~25 ms a test otherwise); each test starts it empty (``redis``)."""
    return fakeredis.FakeServer()


@pytest.fixture
async def redis(redis_server: fakeredis.FakeServer) -> AsyncIterator[fakeredis.FakeAsyncRedis]:
    r = fakeredis.FakeAsyncRedis(server=redis_server, lua_modules={"bit"})
    await r.flushall()
    try:
        yield r
    finally:
        await r.aclose()


@pytest.fixture
def store(redis: fakeredis.FakeAsyncRedis) -> OffsetStore:
    return OffsetStore(redis, "mqgw")


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@dataclass
class Gateway:
    """One node's core services over ``store`` and ``broker``, built as the app builds them."""

    settings: Settings
    store: OffsetStore
    broker: MemoryBroker
    consume: ConsumeService
    checkpoints: Checkpoints
    registry: Registry
    codec: RequestIdCodec

    async def fetch(self, consumer: str, topic: str = "orders", **kw: Any) -> Fetched:
        """A ``/message`` as the service takes it: no wait, cluster mode unless a clientId."""
        base: dict[str, Any] = dict(consumer=consumer, client_id="", topic=topic, max_messages=10,
                                    wait_ms=0, address="unit")
        return await self.consume.fetch(FetchParams(**{**base, **kw}))


def build(store: OffsetStore, broker: MemoryBroker, **settings: Any) -> Gateway:
    """The services as the app wires them (settings over :data:`BASE_SETTINGS`)."""
    conf = Settings(**{**BASE_SETTINGS, **settings})
    checkpoints = Checkpoints(conf, store, broker)
    codec = RequestIdCodec(conf.hmac_key)
    consume = ConsumeService(conf, store, broker,
                             Watermarks(store, broker, conf.metadata_refresh_ms), codec,
                             Authorizer(conf.auth, KeyStore(store)), checkpoints=checkpoints)
    return Gateway(conf, store, broker, consume, checkpoints, Registry(store, conf, checkpoints),
                   codec)


@pytest.fixture
def make_gateway(store: OffsetStore, broker: MemoryBroker) -> Callable[..., Gateway]:
    """Another node (or the same one with other settings) on the same Redis and broker."""
    def make(**settings: Any) -> Gateway:
        return build(store, broker, **settings)
    return make


@pytest.fixture
def gw(make_gateway: Callable[..., Gateway]) -> Iterator[Gateway]:
    yield make_gateway()
