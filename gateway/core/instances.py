"""REST v2 consumer instances (the Confluent REST Proxy's consumer API), served by any node.

The Confluent proxy (and Karapace, and the Strimzi bridge) keeps a Kafka consumer per instance
in one node's memory: its clients must come back to that node, and an instance dies with it.
Here an instance is a small hash in Redis (store/instances.py) that any node reads, and each
call is the gateway's own consume path:

- ``records`` is one ``/message`` over the subscription (several topics: core/consume.py),
  in cluster mode as the consumer the group names; the batch's requestId is kept as pending.
- **auto-commit** (on unless the instance was made with ``auto.commit.enable=false``, as in
  Kafka): the pending batches are acked at the next ``records`` (one of them piggy-backed on
  its fetch) and when the instance is deleted, as Kafka's auto-commit commits what the last
  poll returned at the next poll and at close.
- ``commit`` acks the pending batches that the given offsets cover whole (an offset at or past
  a batch's last record); with none given, every pending batch.
- ``delete`` acks (auto-commit) or hands back (``/unlock``) the pending batches, then forgets
  the instance.

Where this differs from a Kafka consumer (docs/rest-v2.md says it to users): there is no
partition assignment: any instance of a group takes whichever queue is free, as any
``/message`` does. A batch not committed within the consumer's lock timeout is redelivered, to
this or another instance (at-least-once); an offset inside a batch commits nothing until one at
or past its end does. There are no positions of an instance's own: a seek (``positions``) moves
the consumer's committed offsets of those queues, as an offset reset does (core/reset.py), for
every instance of the group at once, and it stays even if nothing is committed after it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple

import orjson

from ..broker import UnknownTopic
from ..config import Settings
from ..schemas import Kind
from ..store import AckOutcome, AckResult, Credential, InstanceGone, OffsetStore, now_ms
from ..store.instances import BATCH, VERSION, Written, fetched_ms, pending
from .auth import Authorizer
from .checkpoint import Checkpoints
from .consume import ConsumeService
from .errors import Busy, Conflict, DomainError, denied, invalid, unknown
from .fetch import Fetched, FetchParams, FetchStatus
from .names import InternalTopics, check_name, check_public_topic
from .registry import Registry, topics_refused
from .requestid import BatchRef
from .reset import ResetRequest, reset
from .schemas import Decoded, SchemaService

#: Pending batches an instance keeps at most (one per ``records`` without a commit): beyond it
#: the oldest are forgotten (their locks ran out long ago: redelivered, nothing lost).
MAX_PENDING = 256
#: Topics in one subscription at most (as many as one ``/message`` takes).
MAX_TOPICS = 16
#: What a commit may find and still call done.
_SETTLED = (AckOutcome.COMMITTED, AckOutcome.ALREADY_COMMITTED)
#: Instances whose settings a process remembers at most (see ``InstanceService._known``).
KNOWN_MAX = 10_000


class Format(StrEnum):
    """How an instance's records travel: ``binary`` (base64), ``json`` (the JSON they hold), or
    decoded with their schema from the Schema Registry (``avro``, ``protobuf``,
    ``jsonschema``: core/schemas.py)."""

    BINARY = "binary"
    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"
    JSONSCHEMA = "jsonschema"

    @property
    def kind(self) -> Kind | None:
        """The schema kind of a Schema Registry format; None for binary and json."""
        return _KINDS.get(self)


_KINDS = {Format.AVRO: Kind.AVRO, Format.PROTOBUF: Kind.PROTOBUF, Format.JSONSCHEMA: Kind.JSON}



@dataclass(frozen=True, slots=True)
class Instance:
    consumer: str
    name: str
    format: Format
    #: Where a queue new to the consumer starts: ``earliest``, ``latest``, or "" for the
    #: gateway's ``start_position`` (Kafka's ``auto.offset.reset``).
    reset: str
    auto_commit: bool
    #: How long ``records`` waits for records by default (``consumer.request.timeout.ms``).
    wait_ms: int
    #: Records per ``records`` at most (``max.poll.records``).
    max_records: int
    topics: tuple[str, ...]
    #: requestId -> when it was fetched (ms): batches not yet committed or handed back.
    pending: dict[str, int]
    #: The settings' version (a new one at each subscription).
    version: str = ""

    def fields(self) -> dict[str, str]:
        return {"fmt": self.format.value, "reset": self.reset, "commit": "1" if self.auto_commit
                else "0", "wait": str(self.wait_ms), "max": str(self.max_records),
                "topics": ",".join(self.topics), VERSION: self.version}

    @classmethod
    def parse(cls, consumer: str, name: str, h: dict[str, str]) -> Instance:
        return cls(consumer, name, Format(h.get("fmt", "binary")), h.get("reset", ""),
                   h.get("commit", "1") == "1", int(h.get("wait", "0")),
                   int(h.get("max", "1")), tuple(t for t in h.get("topics", "").split(",") if t),
                   {k[len(BATCH):]: fetched_ms(v) for k, v in h.items() if k.startswith(BATCH)},
                   h.get(VERSION, ""))


class LostBatch(NamedTuple):
    """A batch a commit came too late for: its lock ran out, and its records went (or will
    go) to another fetch."""

    topic: str
    queue: str
    offset: int


@dataclass(frozen=True, slots=True)
class Committed:
    """A ``commit``'s outcome: the batches acked, and those that could not be any more (their
    lock ran out and the records went, or will go, to another fetch)."""

    acked: list[AckResult]
    lost: list[LostBatch]


class InstanceService:
    def __init__(self, settings: Settings, store: OffsetStore, consume: ConsumeService,
                 authorizer: Authorizer, registry: Registry,
                 checkpoints: Checkpoints | None = None,
                 schemas: SchemaService | None = None) -> None:
        self.settings = settings
        #: The Schema Registry's formats; None: not configured (those formats are refused).
        self.schemas = schemas
        self.registry = registry
        self.checkpoints = checkpoints
        self.store = store
        self.instances = store.instances
        self.consume = consume
        self.auth = authorizer
        self.ttl_ms = settings.instance_timeout_ms
        self.internal = InternalTopics.of(settings, consume.broker.owns_topic)
        #: The settings of instances this process served, so that their ``records`` cost no
        #: read of the instance: the write after the fetch says whether they still hold
        #: (lua/instance.lua: gone, or another version). With auto-commit, the commit of the
        #: pending batches (one script, which tells a deleted instance too) takes the read's
        #: place.
        self._known: dict[tuple[str, str], Instance] = {}

    # -- life -----------------------------------------------------------------------------
    async def create(self, credential: Credential | None, consumer: str, name: str | None,
                     fmt: Format, reset: str, auto_commit: bool, wait_ms: int | None,
                     max_records: int | None) -> Instance:
        consumer = check_name(consumer, "consumer")
        name = check_name(name, "instance", required=False) or f"rest-consumer-{uuid.uuid4().hex}"
        if fmt.kind is not None and self.schemas is None:
            raise invalid("invalid_format", f"format {fmt.value!r} decodes records with their "
                          "schemas, and this gateway has no schema registry (set "
                          "schema_registry_url: MQGW_SCHEMA_REGISTRY_URL)")
        await self.auth.require_consume(credential, consumer)
        await self._unsharded(consumer)
        inst = Instance(consumer, name, fmt, reset, auto_commit,
                        self.settings.instance_wait_ms if wait_ms is None else wait_ms,
                        max_records or self.settings.default_max_messages, (), {},
                        uuid.uuid4().hex[:12])
        if not await self.instances.create(consumer, name, inst.fields(), self.ttl_ms):
            raise Conflict("instance_exists", f"consumer {consumer!r} has an instance "
                           f"{name!r} already (DELETE it, or pick another name)")
        return inst

    async def get(self, credential: Credential | None, consumer: str, name: str,
                  check_key: bool = True) -> Instance:
        """The instance (its life extended), after the key was found allowed to use it
        (``check_key`` False: the caller's next step checks it, in the script it runs)."""
        consumer = check_name(consumer, "consumer")
        name = check_name(name, "instance")
        if check_key:
            await self.auth.require_consume(credential, consumer)
        return await self._load(consumer, name)

    async def _load(self, consumer: str, name: str) -> Instance:
        h = await self.instances.load(consumer, name, self.ttl_ms)
        if h is None:
            raise _gone(consumer, name)
        return Instance.parse(consumer, name, h)

    async def delete(self, credential: Credential | None, consumer: str, name: str) -> None:
        """Commit (auto-commit) or hand back the pending batches, then forget the instance."""
        inst = await self.get(credential, consumer, name)
        await self._settle(inst, self._refs(inst), credential,
                           commit=inst.auto_commit)
        await self.instances.delete(consumer, name)
        self._forget(consumer, name)

    async def _unsharded(self, consumer: str) -> None:
        """An instance commits all its batches in one script call in the consumer's slot, which
        a consumer spread over several shards (store/shards.py) does not have: refused."""
        if await self.store.shards.get(consumer) > 1:
            raise Conflict("sharded_consumer", f"consumer {consumer!r} has several shards: "
                           "REST v2 instances serve consumers of one shard (use /message and "
                           "/ack, or another consumer name)")

    # -- subscription ---------------------------------------------------------------------
    async def subscribe(self, credential: Credential | None, consumer: str, name: str,
                        topics: Sequence[object]) -> None:
        """Replace the subscription (an empty list: none)."""
        if len(topics) > MAX_TOPICS:
            raise invalid("invalid_topics", f"a subscription takes at most {MAX_TOPICS} topics")
        names = tuple(dict.fromkeys(check_public_topic(t, self.internal) for t in topics))
        inst = await self.get(credential, consumer, name)
        # Refused now rather than at the first fetch (a 204 here and a 403 there misled users);
        # the fetch still checks, since the registration may change after this.
        refused = topics_refused(await self.registry.config(consumer), names)
        if refused:
            raise denied("topic_not_allowed", f"consumer {consumer!r} is not registered for "
                         f"topic {refused[0]!r}")
        self._forget(consumer, name)
        await self._write(inst, put={"topics": ",".join(names), VERSION: uuid.uuid4().hex[:12]})

    # -- records and offsets ----------------------------------------------------------------
    async def records(self, credential: Credential | None, consumer: str, name: str,
                      fmt: Format | None, wait_ms: int | None, max_bytes: int,
                      address: str, again: bool = False,
                      ) -> tuple[Instance, Fetched, list[Decoded] | None]:
        """One fetch over the subscription (``fmt``: the format the caller reads, which must be
        the instance's), and, for a Schema Registry format, its records decoded. With
        auto-commit, what the last call returned is committed first."""
        # The key is checked by the fetch's script, at no cost of its own; a refusal before it
        # is answered only once the key was checked (api/routes.py key_first).
        inst = self._known.get((consumer, name))
        await self._unsharded(consumer)
        if inst is None:
            inst = await self.get(credential, consumer, name, check_key=False)
            if len(self._known) >= KNOWN_MAX:
                self._known.clear()
            self._known[(consumer, name)] = replace(inst, pending={})
        elif inst.auto_commit:  # what the last call returned, committed first
            await self._commit_all(credential, consumer, name, wake=False)
        if fmt is not None and fmt is not inst.format:
            raise invalid("format_mismatch", f"instance {name!r} was made with format "
                          f"{inst.format.value!r}; ask for its records in that format")
        if not inst.topics:
            self._forget(consumer, name)
            raise Conflict("not_subscribed", f"instance {name!r} is not subscribed to any "
                           "topic (POST .../subscription first)")
        wait = min(inst.wait_ms if wait_ms is None else wait_ms, self.settings.max_wait_ms)
        topics = [t for t in inst.topics if await self._exists(t)]
        if not topics:  # as a Kafka consumer of topics not made yet: nothing, after the wait
            await self.auth.require_consume(credential, consumer)
            await self._write(inst)  # (its life extended; it must still be there)
            await asyncio.sleep(wait / 1000)
            return inst, Fetched(FetchStatus.EMPTY, inst.topics[0]), None
        settled = self._refs(inst) if inst.auto_commit else {}
        piggy = next((r for r, ref in settled.items() if ref.topic in topics), "")
        others = {r: ref for r, ref in settled.items() if r != piggy}
        if others:
            await self._settle(inst, others, credential, commit=True)
        got = await self.consume.fetch(FetchParams(
            consumer, "", topics[0], inst.max_records, wait, address, ack_request_id=piggy,
            credential=credential, also_topics=tuple(topics[1:]), max_bytes=max_bytes,
            start=inst.reset))
        unreadable: DomainError | None = None
        decoded: list[Decoded] | None = None
        if got.batch is not None and inst.format is Format.JSON:
            bad = next((i for i, r in enumerate(got.batch.records)
                        if not (_is_json(r.key) and _is_json(r.value))), None)
            if bad is not None:
                got, unreadable = self._readable_part(got, bad, "is not JSON: read this "
                                                      "consumer's records as binary (format: binary)")
        elif got.batch is not None and inst.format.kind is not None:
            got, decoded, unreadable = await self._decoded(got, inst.format, credential)
        put: dict[str, str] = {}
        if got.batch is not None:
            ref = got.batch.ref
            assert ref is not None  # (every batch the fetcher answers carries it)
            put[BATCH + got.batch.request_id] = pending(
                now_ms(), ref.topic, ref.queue, ref.offset, ref.next_offset, ref.token,
                ref.high_watermark)
        written = await self.instances.update(consumer, name, self.ttl_ms,
                                              [BATCH + r for r in settled], put,
                                              version=inst.version, max_pending=MAX_PENDING)
        if written is not Written.DONE:
            self._forget(consumer, name)
            if got.batch is not None and got.batch.ref is not None:  # nobody would commit it
                await self.consume.release(got.batch.ref, credential)
            if written is Written.STALE:  # subscribed anew meanwhile: again, on the new one
                if again:
                    raise Conflict("instance_changed", f"instance {name!r} was subscribed "
                                   "anew during the call; call again")
                return await self.records(credential, consumer, name, fmt, wait_ms, max_bytes,
                                          address, again=True)
            raise _gone(consumer, name)
        if unreadable is not None:
            raise unreadable
        return inst, got, decoded

    async def _decoded(self, got: Fetched, fmt: Format, credential: Credential | None,
                       ) -> tuple[Fetched, list[Decoded], DomainError | None]:
        """A schema format's batch decoded, cut at its first record that does not decode (as a
        json instance's at one that is not JSON). A registry that does not answer hands the
        batch back (``/unlock``: fetched again at once, not after the lock timeout) and the
        call is answered 503."""
        b, kind = got.batch, fmt.kind
        assert b is not None and b.ref is not None and kind is not None and self.schemas
        out: list[Decoded] = []
        for i, r in enumerate(b.records):
            try:
                out.append((await self.schemas.decode(kind, r.key),
                            await self.schemas.decode(kind, r.value)))
            except Busy:
                await self.consume.release(b.ref, credential)
                raise
            except DomainError as e:
                cut, error = self._readable_part(got, i, f"does not decode as {fmt.value} "
                                                 f"({e.message}): read this consumer's records "
                                                 "as binary (format: binary)")
                return cut, out, error
        return got, out, None

    def _readable_part(self, got: Fetched, bad: int,
                       problem: str) -> tuple[Fetched, DomainError | None]:
        """A batch cut at its first record (``bad``) the instance cannot read (a json one's
        that is not JSON, a schema format's that does not decode: ``problem``), so that no
        commit goes past records nobody received (issue 33: a batch with one bad
        record was answered 422 and then committed whole, losing the valid records after it).
        Records before the bad one are answered, as a batch ending there; a bad record first is
        a batch of its own, answered ``422`` (``42203``) and pending like any batch: the next
        auto-commit fetch (or a commit of everything fetched) goes past it, and only it;
        uncommitted, it comes back after the lock timeout."""
        b = got.batch
        assert b is not None and b.ref is not None
        cut = b.records[bad].offset + 1 if bad == 0 else b.records[bad].offset
        ref = replace(b.ref, next_offset=cut)
        batch = replace(b, records=b.records[:max(bad, 1)], next_offset=cut, ref=ref,
                        request_id=self.consume.codec.encode(ref))
        if bad:
            return replace(got, batch=batch), None
        part = int(b.queue) if b.queue.isdigit() else b.queue
        return replace(got, batch=batch), invalid(
            "json_conversion", f"the record at {b.topic} partition {part} offset "
            f"{b.records[0].offset} {problem}; the next commit goes past it")

    async def commit(self, credential: Credential | None, consumer: str, name: str,
                     offsets: list[tuple[str, str, int]] | None) -> Committed:
        """Ack the pending batches ``offsets`` (topic, queue, offset of the last record
        processed) cover whole; None: all of them."""
        if offsets is None:
            return await self._commit_all(credential, consumer, name)
        inst = await self.get(credential, consumer, name)
        refs = self._refs(inst)
        if offsets is not None:
            upto: dict[tuple[str, str], int] = {}
            for t, q, o in offsets:
                upto[(t, q)] = max(o, upto.get((t, q), -1))
            refs = {r: ref for r, ref in refs.items()
                    if upto.get((ref.topic, ref.queue), -1) + 1 >= ref.next_offset}
        return await self._settle(inst, refs, credential, commit=True)

    async def committed(self, credential: Credential | None, consumer: str, name: str,
                        queues: list[tuple[str, str]]) -> list[tuple[str, str, int]]:
        """The consumer's committed offset (the next to read) of each (topic, queue); -1 for
        a queue it has none of."""
        inst = await self.get(credential, consumer, name)
        have = {(q.topic, q.queue): q.committed for q in await self.store.queue_states(consumer)}
        del inst  # loaded for its checks (it exists; its life extended)
        return [(t, q, have.get((t, q), -1)) for t, q in queues]

    async def seek(self, credential: Credential | None, consumer: str, name: str, to: str,
                   targets: list[tuple[str, str, int]]) -> None:
        """Move the consumer's committed offsets of (topic, queue) to ``to`` (``earliest``,
        ``latest``, or ``offset``: each target's offset, the next record to read), after
        handing back the instance's batches of those queues."""
        inst = await self.get(credential, consumer, name)
        cfg, _ = await self.registry.writable(consumer)
        queues = {(t, q) for t, q, _ in targets}
        refs = self._refs(inst)
        mine = {r: ref for r, ref in refs.items() if (ref.topic, ref.queue) in queues}
        await self._settle(inst, mine, credential, commit=False)
        for t, q, offset in targets:
            check_public_topic(t, self.internal)
            await reset(self.store, self.consume.broker, consumer,
                        ResetRequest(topic=t, to=to, queue=q, offset=offset if to == "offset"
                                     else None), cfg, self.settings.client_idle_ms,
                        self.checkpoints)

    # -- internals --------------------------------------------------------------------------
    async def _commit_all(self, credential: Credential | None, consumer: str,
                          name: str, wake: bool = True) -> Committed:
        """Every pending batch acked, in one script call (the usual ``POST .../offsets``)."""
        consumer = check_name(consumer, "consumer")
        name = check_name(name, "instance")
        try:
            done = await self.store.ack_instance(
                consumer, name, self.ttl_ms, default_timeout_ms=self.settings.consume_timeout_ms,
                credential=credential)
        except InstanceGone:
            self._forget(consumer, name)
            raise _gone(consumer, name) from None
        if done is None:
            raise await self.auth.consume_refused(credential, consumer)
        acked: list[AckResult] = []
        lost: list[LostBatch] = []
        for a in done:
            if a.result is not None:
                self.consume.acked(consumer, "", a.topic, a.result, wake)
                acked.append(a.result)
                if a.result.result not in _SETTLED:
                    lost.append(LostBatch(a.topic, a.queue, a.offset))
        legacy = {a.request_id: self._ref(a.request_id) for a in done if a.result is None}
        if legacy:
            inst = await self.get(credential, consumer, name)
            more = await self._settle(inst, legacy, credential, commit=True)
            acked += more.acked
            lost += more.lost
        return Committed(acked, lost)

    def _ref(self, request_id: str) -> BatchRef:
        return self.consume.decode(request_id)

    def _refs(self, inst: Instance) -> dict[str, BatchRef]:
        """The instance's pending batches, by requestId."""
        return {r: self._ref(r) for r in inst.pending}

    def _forget(self, consumer: str, name: str) -> None:
        """Drop the cached settings of an instance that changed or is gone."""
        self._known.pop((consumer, name), None)

    async def _exists(self, topic: str) -> bool:
        try:
            await self.consume.wm.get(topic)
        except UnknownTopic:
            return False
        return True

    async def _settle(self, inst: Instance, batches: dict[str, BatchRef],
                      credential: Credential | None, commit: bool) -> Committed:
        """Ack (``commit``) or unlock each batch (requestId: its verified reference), then drop
        them from the pending ones."""
        acked: list[AckResult] = []
        lost: list[LostBatch] = []
        for ref in batches.values():
            if commit:
                r = await self.consume.commit(ref, credential)
                acked.append(r)
                if r.result not in _SETTLED:
                    lost.append(LostBatch(ref.topic, ref.queue, ref.offset))
            else:
                await self.consume.release(ref, credential)
        if batches:
            await self._write(inst, drop=[BATCH + r for r in batches])
        return Committed(acked, lost)

    async def _write(self, inst: Instance, drop: Sequence[str] = (),
                     put: dict[str, str] | None = None) -> None:
        if await self.instances.update(inst.consumer, inst.name, self.ttl_ms, drop,
                                       put) is not Written.DONE:
            raise _gone(inst.consumer, inst.name)


def _gone(consumer: str, name: str) -> Exception:
    return unknown("unknown_instance", f"consumer {consumer!r} has no instance {name!r} (it "
                   "was deleted, or expired after instance_timeout_ms without a call)")


def _is_json(v: bytes | None) -> bool:
    """Whether a json instance can answer this key or value (None is JSON's null)."""
    if v is None:
        return True
    try:
        orjson.loads(v)
    except orjson.JSONDecodeError:
        return False
    return True
