"""The broker interface the HTTP and Redis code is written against.

A broker exposes *queues* (Kafka partitions, RocketMQ message queues) named by an
opaque string id. Offsets are the broker's own; ``hi`` is the next offset to be
written (Kafka's high watermark), so a queue's backlog is ``hi - committed``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


class UnknownTopic(Exception):
    pass


@dataclass(slots=True)
class Record:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int  # ms since the epoch, -1 if the broker gave none


@dataclass(slots=True)
class FetchResult:
    records: list[Record]
    #: High watermark learned from the fetch response, -1 if unknown.
    high_watermark: int = -1
    #: The requested offset is below the earliest retained one; ``low_watermark`` says where data starts.
    out_of_range: bool = False
    low_watermark: int = -1
    #: With no records: the offset the broker says the readable log ends at, when it is above the
    #: requested one (offsets taken by transaction markers or aborted records), else -1.
    end_offset: int = -1


@dataclass(slots=True)
class OutgoingMessage:
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    partition: int | None = None
    timestamp: int | None = None


@dataclass(slots=True)
class ProduceResult:
    partition: int = -1
    offset: int = -1
    error_code: str = ""
    error: str = ""


class Broker(ABC):
    """One broker cluster. Implementations hold long-lived clients created in :meth:`start`."""

    name: str

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Connect long-lived clients."""

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
    async def fetch(self, topic: str, queue: str, offset: int, max_records: int) -> FetchResult:
        """Read up to ``max_records`` starting at ``offset``; return what is readable now."""

    @abstractmethod
    async def produce(self, topic: str, messages: list[OutgoingMessage]) -> list[ProduceResult]:
        """Send and wait until the broker acknowledged each message (or failed it)."""

    async def ping(self) -> bool:
        """Is the broker reachable? Used by readiness checks."""
        return True
