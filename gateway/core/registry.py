"""Registered consumers and producers, held in Redis so every node sees a change at once.

A consumer's registration is its config hash ``P:{G}:cfg``, the hash the choose and ack
scripts already read: registering, pausing or rate-limiting a consumer is one write there,
and the next ``/message`` on any node obeys it without a reload. Producers are entries of
``P:{reg}:producers`` (name -> JSON), read by the produce check script. The reads and writes
are the store's (``gateway.store.registry``); this module decides what may change. The admin
API's JSON (camelCase) is ``gateway.api.registry_wire``'s; here a consumer is the snake_case
fields of its hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config import Settings
from ..store import OffsetStore, now_ms
from ..store.shards import MAX_SHARDS, parse_shards
from .checkpoint import Checkpoints
from .errors import Conflict, invalid, unknown
from .names import INTERNAL_PREFIX, InternalTopics, check_public_topic
from .retry import check_policy_fields

#: Unregistered (open-mode) consumers listed in views, alert evaluations and metrics: the most
#: recently seen this many. Registered consumers are always listed.
SEEN_LIMIT = 1000
__all__ = ["MAX_SHARDS", "ConsumerRecord", "DeleteResult", "ProducerRecord", "Registry",
           "topics_refused"]


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """A consumer's config hash: its registration (``registered`` = "1") and settings."""

    name: str
    fields: dict[str, str]
    #: This write made the consumer: in open mode, a name never seen before (no settings,
    #: offsets or fetch). Said in the answer, so that a typo does not pass unnoticed.
    created: bool = False


@dataclass(frozen=True, slots=True)
class ProducerRecord:
    name: str
    topics: list[str]
    created_ms: int
    updated_ms: int


@dataclass(frozen=True, slots=True)
class DeleteResult:
    consumer: str
    unregistered: bool  # it had a registration or settings
    offsets_deleted: bool
    keys_deleted: int  # Redis offset keys removed


class Registry:
    def __init__(self, store: OffsetStore, settings: Settings,
                 checkpoints: Checkpoints | None = None,
                 internal: InternalTopics | None = None) -> None:
        self.store = store
        #: Topics no registration may name (the gateway's and the broker's own).
        self.internal = internal or InternalTopics.of(settings)
        self.checkpoints = checkpoints
        self.records = store.registry
        self.settings = settings

    # -- consumers ---------------------------------------------------------------------------
    async def config(self, consumer: str) -> dict[str, str]:
        return await self.records.config(consumer)

    async def get_consumer(self, consumer: str) -> ConsumerRecord:
        return ConsumerRecord(consumer, await self.require_seen(consumer))

    async def require_seen(self, consumer: str, client_id: str = "") -> dict[str, str]:
        """The consumer's config, for the views: ``404 unknown_consumer`` (``unknown_client``)
        for a name that left no trace at all (no registration, settings, offsets or fetch), in
        every mode, so that a typo in a view's name is told rather than shown as empty."""
        cfg = await self.config(consumer)
        if not cfg and not consumer.startswith(INTERNAL_PREFIX) and not await self.records.known(consumer):
            raise unknown("unknown_consumer", f"consumer {consumer!r} is unknown: not registered, "
                          "and never fetched or given settings")
        if client_id and not await self.records.known(consumer, client_id):
            raise unknown("unknown_client", f"consumer {consumer!r} has no broadcast clientId "
                          f"{client_id!r} (never seen, or forgotten after client_idle_ms)")
        return cfg

    def _check(self, given: dict[str, str | None], merged: dict[str, str]) -> None:
        """The rules across fields, on the hash as it will be (``merged``); topics only where
        ``given`` names them (a registration kept from before is not refused for them)."""
        internal = self.internal
        for t in (given.get("topics") or "").split(","):
            if t:
                check_public_topic(t, internal)
        if given.get("retry_dead_letter_topic"):
            check_public_topic(given["retry_dead_letter_topic"], internal)
        check_policy_fields(merged)
        if merged.get("burst") and not merged.get("rate"):
            raise invalid("invalid_rate_limit", "rateLimit.burst needs "
                          "rateLimit.messagesPerSecond (the consumer has no rate limit)")

    async def put_consumer(self, consumer: str, fields: dict[str, str | None]) -> tuple[ConsumerRecord, bool]:
        """Register (or re-register) with exactly ``fields`` (hash fields; None: unset);
        returns (the record, created)."""
        fields = dict(fields)
        if fields.get("mode") is None:  # left out or null: the default, never "no mode"
            fields["mode"] = "cluster"
        old = await self.config(consumer)
        now = str(now_ms())
        values = {k: v for k, v in fields.items() if v is not None}
        self._check(fields, values)
        await self._check_shards(consumer, old, values)
        values.update(registered="1", updated_ms=now, created_ms=old.get("created_ms") or now)
        await self.records.replace_config(consumer, values)
        await self.records.add_registered(consumer)
        return ConsumerRecord(consumer, values), not old.get("registered")

    async def patch_consumer(self, consumer: str, fields: dict[str, str | None]) -> ConsumerRecord:
        """Change only the given hash fields (None clears one), nothing else; works for
        open-mode consumers (``created`` when this made the name)."""
        cfg = await self.config(consumer)
        if not cfg and not self.settings.open_mode:
            raise unknown("unknown_consumer", f"consumer {consumer!r} is not registered")
        created = not cfg and not await self.records.known(consumer)
        if cfg.get("registered") == "1":
            if "topics" in fields and fields["topics"] is None:
                raise invalid("invalid_topics", "a registered consumer needs topics")
            if "mode" in fields and fields["mode"] is None:  # back to the default, as PUT does
                fields = {**fields, "mode": "cluster"}
        elif {"topics", "mode"} & set(fields):  # only a registration holds a consumer to them
            raise invalid("registration_required", f"consumer {consumer!r} is not registered: "
                          "topics and mode are enforced only for registered consumers "
                          f"(PUT /admin/consumers/{consumer})")
        sets = {k: v for k, v in fields.items() if v is not None}
        # checked on the hash as it will be: a PATCH of one retry field may mix a policy
        # (read-check-write: two PATCHes at once could still, rarely, leave a mixed policy)
        merged = {**{k: v for k, v in cfg.items() if k not in fields}, **sets}
        self._check(fields, merged)
        await self._check_shards(consumer, cfg, merged)
        sets["updated_ms"] = str(now_ms())
        await self.records.update_config(consumer, sets, [k for k, v in fields.items() if v is None])
        if cfg.get("registered") != "1":  # settings of an open-mode name: list it (and watch
            await self.records.mark_seen(consumer, now_ms())  # its alert thresholds)
        return ConsumerRecord(consumer, await self.config(consumer), created)

    async def _check_shards(self, consumer: str, old: dict[str, str], new: dict[str, str]) -> None:
        """A consumer's shard count (store/shards.py) changes only while it has no offsets:
        moving queues between Redis Cluster slots cannot be atomic, and queues filed under the
        old count would be read twice or not at all."""
        was, will = parse_shards(old.get("shards")), parse_shards(new.get("shards"))
        if was != will and await self.store.has_offsets(consumer):
            raise Conflict("shards_fixed", f"consumer {consumer!r} has offsets under {was} "
                           f"shard(s): its shards change only after DELETE "
                           f"/admin/consumers/{consumer}?deleteOffsets=true", shards=was)

    async def require_known(self, consumer: str) -> dict[str, str]:
        """The consumer's config; 404 unless it is registered or open mode serves it, so that an
        operator's typo fails instead of pausing or resetting a name nobody consumes as."""
        return (await self.writable(consumer))[0]

    async def writable(self, consumer: str) -> tuple[dict[str, str], bool]:
        """(config, created) for a write: outside open mode only a registered consumer
        (``404 unknown_consumer``); in open mode any name, ``created`` when it was never seen
        (the write makes it, and the answer says so)."""
        cfg = await self.config(consumer)
        if cfg.get("registered") == "1":
            return cfg, False
        if not self.settings.open_mode:
            raise unknown("unknown_consumer", f"consumer {consumer!r} is not registered")
        return cfg, not cfg and not await self.records.known(consumer)

    async def set_paused(self, consumer: str, paused: bool) -> bool:
        """Pause or resume; True when this created the consumer (see :meth:`writable`)."""
        cfg, created = await self.writable(consumer)
        await self.store.set_config(consumer, {"paused": "1" if paused else "0", "updated_ms": now_ms()})
        if cfg.get("registered") != "1":  # as patch_consumer: an open-mode name with settings is listed
            await self.records.mark_seen(consumer, now_ms())
        return created

    async def delete_consumer(self, consumer: str, delete_offsets: bool) -> DeleteResult:
        """Unregister: settings and rate bucket go; offsets too if asked. Key grants stay with
        their keys (revoke the key to remove them)."""
        existed, deleted = await self.records.delete_consumer(consumer, delete_offsets)
        if delete_offsets and self.checkpoints is not None:
            # or a consumer of the same name would later resume from the old checkpoint
            await self.checkpoints.forget(consumer)
        return DeleteResult(consumer, existed, delete_offsets, deleted)

    async def consumer_names(self) -> tuple[set[str], set[str]]:
        """(registered, seen) consumer names; the seen ones are those unregistered names (open
        mode) that fetched or got settings within ``client_idle_ms``, at most SEEN_LIMIT."""
        reg, seen = await self.seen_consumers()
        return reg, set(seen)

    async def seen_consumers(self) -> tuple[set[str], dict[str, int]]:
        """(registered names, {seen name: when last seen, ms}), as :meth:`consumer_names`."""
        return await self.records.consumer_names(now_ms() - self.settings.client_idle_ms, SEEN_LIMIT)

    async def list_consumers(self) -> list[ConsumerRecord]:
        reg, seen = await self.consumer_names()
        return [ConsumerRecord(g, await self.config(g)) for g in sorted(reg | seen)]

    # -- producers ---------------------------------------------------------------------------
    # Stored as JSON {"producer", "topics", "createdMs", "updatedMs"} (produce_check.lua reads
    # its topics): the store's format, kept as it was written by earlier versions.
    async def put_producer(self, name: str, topics: list[str]) -> tuple[ProducerRecord, bool]:
        for t in topics:
            check_public_topic(t, self.internal)
        old = await self.get_producer(name, missing_ok=True)
        now = now_ms()
        rec = ProducerRecord(name, topics, old.created_ms if old else now, now)
        await self.records.put_producer(name, {"producer": name, "topics": topics,
                                               "createdMs": rec.created_ms, "updatedMs": now})
        return rec, old is None

    async def get_producer(self, name: str, missing_ok: bool = False) -> ProducerRecord | None:
        raw = await self.records.producer(name)
        if raw is None:
            if missing_ok:
                return None
            raise unknown("unknown_producer", f"producer {name!r} is not registered")
        return _producer(raw)

    async def list_producers(self) -> list[ProducerRecord]:
        return sorted((_producer(r) for r in await self.records.producers()), key=lambda r: r.name)

    async def delete_producer(self, name: str) -> None:
        if not await self.records.delete_producer(name):
            raise unknown("unknown_producer", f"producer {name!r} is not registered")


def topics_refused(cfg: dict[str, str], topics: Sequence[str]) -> list[str]:
    """Of ``topics``, those a consumer with config ``cfg`` may not read: a registered consumer
    reads its registered topics only (choose.lua applies the same rule at every fetch)."""
    if cfg.get("registered") != "1":
        return []
    allowed = cfg.get("topics", "")
    return [t for t in topics if f",{t}," not in allowed]


def _producer(raw: dict[str, object]) -> ProducerRecord:
    topics = raw.get("topics")
    return ProducerRecord(str(raw["producer"]), [str(t) for t in topics] if isinstance(topics, list) else [],
                          int(str(raw.get("createdMs") or 0)), int(str(raw.get("updatedMs") or 0)))
