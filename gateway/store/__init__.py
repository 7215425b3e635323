"""The offset store: consumer state in Redis, decided by Lua scripts (one call per decision).

Nothing outside this package touches a Redis client.
"""

from .connect import UNAVAILABLE, connect
from .offsets import *  # noqa: F401,F403
from .offsets import _s  # noqa: F401
