"""The Lua scripts in ``lua/``, each registered with ``lua/prelude.lua`` (the shared local
functions) in front of it; the prelude's header says why a prelude and not a Function library.

A registered script is called with EVALSHA; redis-py loads it again by itself when Redis
answers NOSCRIPT (a restart or failover empties the script cache). Code that pipelines a
script (``scan.py``) loads it with :func:`source` and handles NOSCRIPT itself.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

_LUA = resources.files("gateway.store") / "lua"


@cache
def source(name: str) -> str:
    """The text registered for ``lua/<name>.lua``: the prelude, then the script."""
    prelude = (_LUA / "prelude.lua").read_text()
    return f"{prelude}\n-- {name}.lua\n{(_LUA / f'{name}.lua').read_text()}"


def sha(name: str) -> str:
    """The SHA1 that EVALSHA calls ``name`` by (what MONITOR shows)."""
    return hashlib.sha1(source(name).encode()).hexdigest()


def register(redis: Redis, name: str) -> AsyncScript:
    """``redis.register_script`` of :func:`source`: a callable ``(keys=, args=)`` script."""
    return redis.register_script(source(name))
