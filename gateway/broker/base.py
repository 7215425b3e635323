"""The broker port: what the core needs from a message broker, and nothing broker-specific.

A broker exposes *queues* (Kafka partitions, RocketMQ message queues) named by an opaque
string id (:data:`QUEUE_ID`). Offsets are the broker's own and need not be contiguous: a fetch
says where the next read starts (:attr:`FetchResult.next_offset`), so the core never computes
``last + 1`` and never knows why offsets were skipped (compaction, transaction markers,
retention, tag filtering). Each adapter owns those rules. ``hi`` is the next offset to be
written (Kafka's high watermark), so a queue's backlog is ``hi - committed``.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum

#: Queue ids are embedded in Redis hash fields (``topic:queue:attr``) and in comma-separated
#: lists, so they may not contain ':' or ','. This is the whole allowed set.
QUEUE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class UnknownTopic(Exception):
    """The topic (or the queue) does not exist on the broker."""


class BrokerUnavailable(Exception):
    """The broker did not answer in time, or failed: the caller should retry."""


class TopicExists(Exception):
    """:meth:`Broker.create_topic`: a topic of that name exists already."""


class TopicRefused(Exception):
    """:meth:`Broker.create_topic`: the broker will not create the topic as asked; retrying the
    same request cannot help. ``code`` says why: ``invalid_topic`` (a name the broker does not
    take, e.g. one colliding with another), ``invalid_partitions``,
    ``invalid_replication_factor`` (more replicas than brokers), ``policy_violation`` (the
    broker's create policy), ``not_authorized`` (the gateway's credentials may not create)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AlreadyWritten(Exception):
    """:meth:`Broker.write_once`: the source range was written already, by a writer that
    committed up to ``position`` (and died before its caller heard): go on from there."""

    def __init__(self, position: int) -> None:
        super().__init__(f"written already up to {position}")
        self.position = position


class CancelRefused(Exception):
    """:meth:`Broker.cancel_delayed`: the broker will not cancel the record. ``too_late``: it is
    due (or delivered) already; else the broker cannot cancel at all."""

    def __init__(self, too_late: bool, message: str) -> None:
        super().__init__(message)
        self.too_late = too_late


class Capability(str, Enum):
    """What a broker can do natively; features ask before they build it themselves."""

    #: The broker holds a record until a due time (RocketMQ 5 timer messages); without it the
    #: gateway delays records itself.
    DELAYED_DELIVERY = "delayed_delivery"
    #: Records can be deleted below an offset (retention moves the low watermark).
    OUT_OF_RETENTION = "out_of_retention"
    #: The broker keeps consumer offsets durably (Kafka consumer groups): the gateway copies
    #: committed offsets there (:meth:`Broker.save_offsets`) and resumes from them when Redis
    #: lost a consumer's offsets.
    OFFSET_CHECKPOINT = "offset_checkpoint"
    #: Records carry a tag, and a read can ask for some tags only (RocketMQ).
    TAG_FILTER = "tag_filter"
    #: Records read from a queue can be written on together with the position they were read
    #: up to, atomically and fencing older writers (Kafka transactions): :meth:`Broker.write_once`.
    EXACTLY_ONCE = "exactly_once"


def check_queue_id(q: str) -> str:
    """A queue id as the port promises it; an adapter that breaks the rule fails loudly."""
    if not QUEUE_ID.fullmatch(q):
        raise ValueError(f"queue id {q!r} is not 1-64 characters of [A-Za-z0-9._-]")
    return q


@dataclass(slots=True)
class Record:
    offset: int
    key: bytes | None
    value: bytes | None
    #: A list, or the empty tuple for none (no new GC-tracked object: kafka/fetch.py ``_record``).
    headers: Sequence[tuple[str, bytes]]
    timestamp: int  # ms since the epoch, -1 if the broker gave none
    #: The record's tag (RocketMQ's TAGS), None where the broker has none.
    tag: str | None = None


def payload_bytes(key: bytes | None, value: bytes | None,
                  headers: Sequence[tuple[str, bytes]]) -> int:
    """A record's size as the gateway counts it (a fetch's ``max_bytes``, a produce's "too
    large" message): key, value, and each header's name (UTF-8) and value, in bytes."""
    return len(key or b"") + len(value or b"") + sum(len(k.encode()) + len(v or b"")
                                                     for k, v in headers)


def fitting(records: Sequence[Record], max_bytes: int) -> int:
    """How many of ``records`` a read limited to ``max_bytes`` (``payload_bytes``; 0: no limit)
    returns: the first always, as Kafka's ``fetch.max.bytes`` does (a queue whose next record
    is larger than the limit would otherwise never move), then as many as fit."""
    if not max_bytes or len(records) < 2:
        return len(records)
    total = 0
    for i, r in enumerate(records):
        total += payload_bytes(r.key, r.value, r.headers)
        if total > max_bytes and i > 0:
            return i
    return len(records)


class SkipReason(str, Enum):
    OUT_OF_RETENTION = "out_of_retention"  # the start offset was deleted by retention
    GAP = "gap"  # offsets with no record before the first returned one (compaction, markers)
    NO_RECORDS = "no_records"  # offsets with no record and nothing readable after them


@dataclass(frozen=True, slots=True)
class Skipped:
    """Offsets ``[start, end)`` a read stepped over without records, and why."""

    start: int
    end: int
    reason: SkipReason


@dataclass(slots=True)
class FetchResult:
    """What a read at ``offset`` returned.

    ``next_offset`` is where the next read starts: after the last record, or past offsets the
    adapter knows hold nothing readable (then ``skipped`` says which and why). With no records
    and nothing skipped it equals the requested offset.
    """

    records: list[Record]
    next_offset: int
    #: High watermark learned from the fetch response, -1 if unknown.
    high_watermark: int = -1
    skipped: Skipped | None = None


@dataclass(slots=True)
class OutgoingMessage:
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    queue: str | None = None  # None: the broker picks (by key, or spreads them)
    timestamp: int | None = None
    #: Deliver at this time (unix ms), for a broker with Capability.DELAYED_DELIVERY only; the
    #: others never get it (core/delay.py writes into the delay wheel for them instead).
    deliver_at: int | None = None
    #: A tag (RocketMQ's TAGS), for a broker with Capability.TAG_FILTER only.
    tag: str | None = None


class ProduceError(StrEnum):
    """Why the broker did not take a record. The values are the codes ``/produce`` answers
    with per record; a StrEnum, so that they format and serialize as those codes."""

    UNKNOWN_TOPIC = "unknown_topic"
    UNKNOWN_PARTITION = "unknown_partition"
    MESSAGE_TOO_LARGE = "message_too_large"
    BROKER_TIMEOUT = "broker_timeout"
    BROKER_ERROR = "broker_error"
    #: A header or key the broker cannot carry (RocketMQ: properties are a string map, some
    #: names are the broker's own).
    INVALID_RECORD = "invalid_record"
    #: A delay the broker refuses (beyond its timer's limit).
    INVALID_DELAY = "invalid_delay"

    @property
    def permanent(self) -> bool:
        """Whether sending the same record again can never succeed (no such topic or queue, a
        record over the size limit), so that a caller drops it rather than retries."""
        return self in (ProduceError.UNKNOWN_TOPIC, ProduceError.UNKNOWN_PARTITION,
                        ProduceError.MESSAGE_TOO_LARGE, ProduceError.INVALID_RECORD,
                        ProduceError.INVALID_DELAY)


@dataclass(slots=True)
class ProduceResult:
    """Where a record was written (``queue``, ``offset``), or why not (``error_code``, None on
    success, and ``error``, a message for people)."""

    queue: str = ""
    offset: int = -1
    error_code: ProduceError | None = None
    error: str = ""
    #: What cancels a record the broker holds until a due time (RocketMQ's recall handle);
    #: empty when it cannot be cancelled there.
    cancel_handle: str = ""


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue of a topic as :meth:`Broker.describe_topics` sees it."""

    queue: str
    #: Its watermarks, -1 when the broker could not tell (a leader moving right now).
    low: int
    high: int
    #: The id of the broker node serving it, -1 if none does (or the broker has no such ids).
    leader: int = -1
    replicas: tuple[int, ...] = ()
    in_sync: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    queues: tuple[QueueInfo, ...]
    #: The broker's own topic (Kafka's ``__consumer_offsets``): only the adapter knows the
    #: broker's conventions for them.
    internal: bool = False


class Broker(ABC):
    """One broker cluster. Implementations hold long-lived clients created in :meth:`start`."""

    name: str
    capabilities: frozenset[Capability] = frozenset()
    #: With Capability.DELAYED_DELIVERY: the longest delay the broker holds (ms); longer ones
    #: go through the gateway's delay wheel.
    native_delay_max_ms: int = 0
    #: The longest topic name the broker takes (Kafka's 249): the gateway's own topics (retry,
    #: dead letters) are cut to it.
    max_topic_length: int = 249

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect long-lived clients."""

    def owns_topic(self, topic: str) -> bool:
        """Whether ``topic`` (a gateway spelling) is the broker's own, or would collide with
        one: nobody may name it through the API (core/names.py ``InternalTopics``)."""
        return False

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release clients."""

    @abstractmethod
    async def queues(self, topic: str) -> list[str]:
        """Queue ids of ``topic``; raises :class:`UnknownTopic`."""

    @abstractmethod
    async def watermarks(self, topic: str) -> dict[str, tuple[int, int]]:
        """``{queue: (low, high)}`` for every queue; raises :class:`UnknownTopic`."""

    @abstractmethod
    async def offset_for_time(self, topic: str, queue: str, timestamp_ms: int) -> int:
        """Earliest offset whose timestamp is >= ``timestamp_ms`` (the high watermark if none)."""

    @abstractmethod
    async def fetch(self, topic: str, queue: str, offset: int, max_records: int,
                    tags: frozenset[str] | None = None, max_bytes: int = 0) -> FetchResult:
        """Read up to ``max_records`` starting at ``offset``; return what is readable now.
        ``tags``: only records with one of these tags (a broker with Capability.TAG_FILTER;
        the others are never asked). ``max_bytes``: no more records than :func:`fitting` keeps
        (0: no limit); ``next_offset`` is then after the last one returned."""

    @abstractmethod
    async def produce(self, topic: str, messages: list[OutgoingMessage],
                      urgent: bool | None = None) -> list[ProduceResult]:
        """Send and wait until the broker acknowledged each message (or failed it). ``urgent``:
        whether a caller waits on these few messages (False: records on their way through the
        delay wheel, which may wait a little to share a larger write; None: the adapter judges
        by their number)."""

    async def write_once(self, group: str, source_topic: str, source_queue: str, start: int,
                         end: int, batches: dict[str, list[OutgoingMessage]],
                         ) -> dict[str, list[ProduceResult]]:
        """With :attr:`Capability.EXACTLY_ONCE`: write ``batches`` ({topic: messages}), read
        from ``[start, end)`` of the source queue, and record ``end`` as ``group``'s position
        there, all or nothing, so that the range is written once whoever writes it: a writer
        that started later fences this one (its write fails, :class:`BrokerUnavailable`), and
        :class:`AlreadyWritten` when the position is past ``start`` already. A record that
        failed for good (an unknown topic, too large) fails the whole write: its result says
        why, nothing was written, and the caller writes again without it."""
        raise NotImplementedError(f"the {self.name} broker has no transactions")

    async def ping(self) -> None:
        """Returns if the broker answers; raises :class:`BrokerUnavailable` saying what is wrong
        otherwise. Used by readiness checks, which bound it in time: an adapter answers it on a
        path of its own, never queued behind requests that wait for a slow broker."""
        return None

    async def topics(self, prefix: str) -> set[str]:
        """The names of the topics that exist and start with ``prefix`` (one metadata call for
        all: the consume path looks for consumers' retry topics this way). Raises
        :class:`BrokerUnavailable`."""
        raise NotImplementedError(f"{self.name} cannot list topics")

    async def ensure_topics(self, topics: dict[str, int], timeout_s: float = 30.0,
                            compacted: bool = False) -> None:
        """Create the topics that do not exist (``{name: queues}``; existing ones are left as
        they are) and return once every queue of each serves reads. For the gateway's own
        topics (the delay wheel's levels; ``compacted``: the registry's copy, where the broker
        keeps the last record of each key for ever). Raises :class:`BrokerUnavailable`."""
        raise NotImplementedError(f"{self.name} cannot create topics")

    # -- topic administration (the admin API's /admin/topics) ----------------------------------
    async def describe_topics(self, names: list[str] | None = None) -> list[TopicInfo]:
        """Queues, replicas and watermarks of the topics ``names`` (None: every topic there is,
        the broker's own included) in one round of metadata and offset requests; a named topic
        that does not exist raises :class:`UnknownTopic`. A queue whose watermarks the broker
        could not give is listed with -1 rather than failing the whole answer. Raises
        :class:`BrokerUnavailable`."""
        raise NotImplementedError(f"{self.name} cannot describe topics")

    async def broker_ids(self) -> list[int]:
        """The ids of the broker nodes (REST v2 ``GET /brokers``). By default those that serve
        or hold a copy of a queue of any topic; an adapter that can list its nodes says so."""
        ids = {i for t in await self.describe_topics() for q in t.queues
               for i in (q.leader, *q.replicas) if i >= 0}
        return sorted(ids)

    async def create_topic(self, name: str, queues: int, replication: int | None = None,
                           timeout_s: float = 30.0) -> None:
        """Create ``name`` with ``queues`` queues and ``replication`` copies of each (None: the
        broker's default), and return once every queue serves reads, so that a produce right
        after it finds them. Raises :class:`TopicExists`, :class:`TopicRefused` or
        :class:`BrokerUnavailable`."""
        raise NotImplementedError(f"{self.name} cannot create topics")

    async def cancel_delayed(self, topic: str, handle: str) -> None:
        """Cancel a record the broker holds until its due time (``ProduceResult.cancel_handle``).
        Raises :class:`CancelRefused` or :class:`BrokerUnavailable`."""
        raise CancelRefused(False, f"{self.name} holds no delayed records")

    # -- offset checkpoints (Capability.OFFSET_CHECKPOINT) ------------------------------------
    async def save_offsets(self, group: str, topic: str, offsets: dict[str, int]) -> None:
        """Store committed offsets (queue -> next offset to read) under the broker's consumer
        group ``group``, without joining it. Raises :class:`BrokerUnavailable`."""
        raise NotImplementedError(f"{self.name} keeps no consumer offsets")

    async def load_offsets(self, group: str, topic: str,
                           queues: list[str] | None = None) -> dict[str, int]:
        """The offsets :meth:`save_offsets` stored for ``topic`` (queues with none left out);
        ``queues``: the topic's queues as the caller knows them (None: ask the broker)."""
        raise NotImplementedError(f"{self.name} keeps no consumer offsets")

    async def forget_offsets(self, group: str) -> None:
        """Delete the group and its offsets (nothing if there is none)."""
        raise NotImplementedError(f"{self.name} keeps no consumer offsets")
