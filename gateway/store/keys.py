"""The Redis key layout: every key name the gateway uses, written here once.

``P`` is the key prefix (``key_prefix``, so several gateways can share one Redis), ``G`` a
consumer's name. ``{...}`` is a Redis Cluster hash tag: all of one consumer's keys live in one
slot, so its scripts run on one node; the registry, each topic's watermarks and the alert state
each have a slot of their own.

==========================  ======  =====================================================
``P:{G}:q``                 hash    cluster-mode queues: ``topic:queue:max|com|lock|tok|acc|addr``
                                    (and ``rtok``, the last reset's token; ``ckp``, the offset
                                    last checkpointed to the broker; ``rdl``, how far the
                                    queue may have been handed out: batches starting below it
                                    are redeliveries; ``out``, the end bound of the current
                                    lock's batch (lua/handed.lua raises it); ``sta``, a start position
                                    a restore in flight is writing to the broker:
                                    core/checkpoint.py),
                                    plus ``poll`` and ``topic:era`` (the Redis process that
                                    chose last: choose.lua)
``P:{G}:q:<clientId>``      hash    the same, one per broadcast clientId (expires when idle)
``<queues>:ir:<topic>``     zset    a queue hash's ready index over one topic (choose.lua;
                                    named in Lua by prelude ``ix_keys``, as are the next two)
``<queues>:il:<topic>``     zset    its lock index
``<queues>:ix:<topic>``     hash    its state: ``built``, ``shards``, ``n:<source>`` (docs/redis.md)
``P:{G}:clients``           zset    broadcast clientIds scored by last-seen time (ms)
``P:{G}:cfg``               hash    the consumer's registration and settings (core/registry.py)
``P:{G}:auth``              hash    API keys that may consume as G: key id -> sha256 of the key
``P:{G}:rl``                hash    rate-limit token bucket: ``tokens``, ``ts``
``P:{G}:inst:<instance>``   hash    a REST v2 consumer instance: settings, subscription, batches
                                    fetched and not yet committed (store/instances.py; expires
                                    when idle)
``P:{G#k}:...``             (all)   shard k = 1..S-1 of a consumer with ``shards`` S > 1
                                    (store/shards.py): every ``{G}`` key above under the tag
                                    ``{G#k}`` or ``{G#k.j}`` (shards.shard_name; shard 0 is
                                    ``{G}``): the queues ``shard_of(queue) == k`` (cluster
                                    mode) or clientIds ``shard_of(clientId) == k``
                                    (broadcast), copies of ``cfg`` (rate and burst divided by
                                    S) and of ``auth``
``P:{wm:<topic>}``          hash    broker watermarks ``queue:lo|hi``, ``queues``, ``ts``, ``ver``,
                                    ``vts``, ``qver`` (watermarks_put.lua)
``P:{wm:<topic>}:lease``    string  who refreshes the watermarks this interval
``P:{wm:<topic>}:chg``      zset    queue -> the copy's version (``ver``) it last moved at
``P:{reg}:consumers``       set     registered consumer names
``P:{reg}:seen_at``         zset    unregistered consumers that fetched or got settings, scored by
                                    when (ms; re-added each minute; pruned after client_idle_ms)
``P:{reg}:producers``       hash    producer name -> JSON registration (topics)
``P:{reg}:keys``            hash    API key id -> JSON record (sha256, name, grants)
``P:{reg}:version``         string  bumped by every key or producer write (store/changes.py)
``P:{reg}:changed:db<N>``   channel that version, published to every gateway process (``N``: the
                                    Redis database, see :attr:`KeyLayout.db`)
``P:{reg}:acks:<version>``  set     processes that dropped their cached produce verdicts for it
``P:{reg}:copied``          string  this Redis holds the registry (restored from, or copied to,
                                    its durable copy in the broker: core/registry_copy.py);
                                    missing after a loss, which starts a restore
``P:{reg}:copy_lock``       string  the node restoring the registry (``SET NX PX``)
``P:{reg}:copy_pending``    set     entities (``consumer/<name>``, ...) written to Redis whose
                                    durable copy the broker did not take yet; sent again by
                                    every node's copy watch until it does
``P:{alerts}:state``        hash    consumer -> JSON alert state (consumers with thresholds)
``P:{alerts}:gauges``       hash    consumer -> JSON ``{totalBacklog, oldestAgeMs}`` (all)
``P:{alerts}:evaluated``    string  time of the last alert evaluation (ms)
``P:{alerts}:lease``        string  node that evaluates alerts this interval (``SET NX PX``)
``P:{alerts}:lock``         string  token of the running alert evaluation
``P:{ckpt}:lease``          string  node that checkpoints offsets to the broker this tick (1 s)
``P:{ckpt}:full``           string  node whose round copies every moved offset, once per
                                    ``checkpoint_interval_ms`` (other rounds: busy ones only)
``P:{delay}:m:<id>``        string  ``c``: a cancelled delayed record, expires
                                    ``delay_mark_retention_ms`` after its due time (``d``,
                                    delivered, only from a relay whose clock runs ahead of
                                    Redis' by over ``delay_cancel_cutoff_ms``; until the due time)
``P:{delay}:poke:db<N>``    channel a level topic that was written to (wakes relays at once)
==========================  ======  =====================================================

Field names are ``topic:queue:attr`` and the scripts take skip lists as ``,q1,q2,``, so a
queue id must contain neither ``:`` nor ``,`` (the broker port enforces this:
``gateway.broker.base.QUEUE_ID``); a consumer name or clientId never contains ``:``, ``{`` or
``}`` (``core/names.py``), which is what lets :meth:`KeyLayout.parse_queue_key` tell the key
kinds apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

#: The attributes of one queue in a consumer's queue hash (``topic:queue:<attr>``).
QUEUE_FIELDS = ("max", "com", "lock", "tok", "acc", "addr", "ckp", "rdl", "out", "sta")
#: Registry keys (``P:{reg}:<what>``) and alert keys (``P:{alerts}:<what>``).
RegistryKey = Literal["consumers", "seen_at", "producers", "keys", "version", "copied",
                      "copy_lock", "copy_pending"]
AlertKey = Literal["state", "gauges", "evaluated", "lease", "lock"]


def glob_escape(s: str) -> str:
    """Escape glob metacharacters for SCAN MATCH (the braces of a hash tag are fine; ``[`` ``*``
    ``?`` are not)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


def queue_field(topic: str, queue: str, attr: str) -> str:
    """A queue's field in a consumer's queue hash."""
    return f"{topic}:{queue}:{attr}"


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The key and channel names under one prefix, in one Redis database."""

    prefix: str = "mqgw"
    #: The Redis database number (``/N`` in ``redis_url``; always 0 on Redis Cluster). Keys live
    #: in their database, but pub/sub channels are server-wide: channel names carry the number,
    #: so deployments sharing a server and a prefix in different databases never hear each
    #: other's notices (nor acknowledge them).
    db: int = 0
    _queue_key: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_queue_key", re.compile(
            re.escape(self.prefix) + r":\{([^{}:#]+)(?:#[0-9.]+)?\}:q(?::([^:{}]+))?"))

    # -- one consumer (hash tag {G}) --------------------------------------------------------
    def queues(self, consumer: str, client_id: str = "") -> str:
        base = f"{self.prefix}:{{{consumer}}}:q"
        return f"{base}:{client_id}" if client_id else base

    def config(self, consumer: str) -> str:
        return f"{self.prefix}:{{{consumer}}}:cfg"

    def clients(self, consumer: str) -> str:
        return f"{self.prefix}:{{{consumer}}}:clients"

    def grants(self, consumer: str) -> str:
        return f"{self.prefix}:{{{consumer}}}:auth"

    def bucket(self, consumer: str) -> str:
        return f"{self.prefix}:{{{consumer}}}:rl"

    def instance(self, consumer: str, name: str) -> str:
        return f"{self.prefix}:{{{consumer}}}:inst:{name}"

    # -- shared -------------------------------------------------------------------------------
    def watermarks(self, topic: str) -> str:
        return f"{self.prefix}:{{wm:{topic}}}"

    def watermark_lease(self, topic: str) -> str:
        return f"{self.watermarks(topic)}:lease"

    def watermark_changes(self, topic: str) -> str:
        """The watermark copy's change index: each queue scored by the copy version it last
        moved at (watermarks_put.lua), so readers read only what moved."""
        return f"{self.watermarks(topic)}:chg"

    def checkpoint_lease(self, what: Literal["lease", "full"] = "lease") -> str:
        return f"{self.prefix}:{{ckpt}}:{what}"

    def delay_mark(self, delay_id: str) -> str:
        """A delayed record's cancel/delivered mark; all in one slot, so one script decides a
        whole batch of them on Redis Cluster too."""
        return f"{self.prefix}:{{delay}}:m:{delay_id}"

    def delay_poke(self) -> str:
        """A channel: like every channel name, scoped by the database too (see :attr:`db`)."""
        return f"{self.prefix}:{{delay}}:poke:db{self.db}"

    def registry(self, what: RegistryKey) -> str:
        """``consumers``, ``seen_at``, ``producers`` or ``keys``: one slot for the whole registry."""
        return f"{self.prefix}:{{reg}}:{what}"

    def registry_acks(self, version: int) -> str:
        return f"{self.prefix}:{{reg}}:acks:{version}"

    def registry_changed(self) -> str:
        """A channel: like every channel name, scoped by the database too (see :attr:`db`)."""
        return f"{self.prefix}:{{reg}}:changed:db{self.db}"

    def alert(self, what: AlertKey) -> str:
        """``state``, ``gauges``, ``evaluated``, ``lease`` or ``lock``: all alert keys share one
        slot, so the alert scripts work on Redis Cluster."""
        return f"{self.prefix}:{{alerts}}:{what}"

    # -- SCAN ---------------------------------------------------------------------------------
    def queue_key_pattern(self) -> str:
        """SCAN MATCH pattern of every consumer queue hash (it also matches a few other keys, such
        as ``P:{G}:quota``: :meth:`parse_queue_key` tells them apart)."""
        return glob_escape(self.prefix) + ":{*}:q*"

    def client_queues_pattern(self, consumer: str) -> str:
        """SCAN MATCH pattern of one consumer's broadcast clientId queue hashes."""
        return glob_escape(self.queues(consumer)) + ":*"

    def parse_queue_key(self, key: str) -> tuple[str, str] | None:
        """``(consumer, clientId)`` of a queue hash key (clientId ``""`` in cluster mode), else None;
        a shard's key (``{G#k}``) reads as its consumer G's."""
        m = self._queue_key.fullmatch(key)
        return (m.group(1), m.group(2) or "") if m else None
