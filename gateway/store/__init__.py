"""The offset store: consumer state in Redis, decided by Lua scripts (one call per decision).

Nothing outside this package touches a Redis client. Modules, one job each:

- ``keys.py``: the key layout (every key name, documented once);
- ``offsets.py``: :class:`OffsetStore`, the consume path (choose, ack, unlock, refund, reset,
  produce check), watermarks, consumer settings and views; it owns the client;
- ``registry.py``: registry records (consumer config hashes and name sets, producers, API keys
  and their grants), as ``store.registry``;
- ``registry_copy.py``: the registry read and written back as entities, for its durable copy in
  the broker, as ``store.registry_copy``;
- ``alerts.py``: the backlog-alert lease, lock and state, as ``store.alerts``;
- ``delay.py``: the relay's settle, delayed records' cancel/delivered marks and relay wake-ups,
  as ``store.delay``;
- ``instances.py``: REST v2 consumer instances, as ``store.instances``;
- ``views.py``: batched reads of many consumers (``store.read_consumers``);
- ``scan.py``: the snapshot's SCAN/HSCAN reading, with a client of its own (:class:`Scanner`);
- ``scripts.py`` and ``lua/``: the scripts, each loaded behind ``lua/prelude.lua``;
- ``connect.py``: connecting, "unavailable" errors, replies as ``str``.
"""

from redis.asyncio import Redis  # the client type, for callers that bring their own (tests: fakeredis)

from .alerts import AlertStore
from .connect import UNAVAILABLE, connect, text, text_dict
from .delay import CancelOutcome, DelayStore, Settled
from .keys import AlertKey, KeyLayout, RegistryKey, glob_escape, queue_field
from .offsets import (
    NO_CREDENTIAL,
    AckOutcome,
    AckResult,
    Chosen,
    Credential,
    ExtendOutcome,
    ExtendResult,
    InstanceGone,
    Lock,
    LockState,
    NeedsRestore,
    NoQueue,
    OffsetStore,
    Paused,
    PendingAck,
    ProduceVerdict,
    RateLimited,
    Refusal,
    Refused,
    UnlockOutcome,
    UnlockResult,
    now_ms,
)
from .queues import QueueState, parse_queue_hash
from .registry import RegistryStore
from .registry_copy import Entity, RegistryCopyStore, entity_key
from .scan import QueueHash, Sample, Scanner, ScanStats, lua_number
from .views import ConsumerRead

__all__ = [
    "NO_CREDENTIAL",
    "UNAVAILABLE",
    "AckOutcome",
    "AckResult",
    "AlertKey",
    "AlertStore",
    "CancelOutcome",
    "Chosen",
    "ConsumerRead",
    "Credential",
    "DelayStore",
    "Entity",
    "ExtendOutcome",
    "ExtendResult",
    "InstanceGone",
    "KeyLayout",
    "Lock",
    "LockState",
    "NeedsRestore",
    "NoQueue",
    "OffsetStore",
    "Paused",
    "PendingAck",
    "ProduceVerdict",
    "QueueHash",
    "QueueState",
    "RateLimited",
    "Redis",
    "Refusal",
    "Refused",
    "RegistryCopyStore",
    "RegistryKey",
    "RegistryStore",
    "Sample",
    "ScanStats",
    "Scanner",
    "Settled",
    "UnlockOutcome",
    "UnlockResult",
    "connect",
    "entity_key",
    "glob_escape",
    "lua_number",
    "now_ms",
    "parse_queue_hash",
    "queue_field",
    "text",
    "text_dict",
]
