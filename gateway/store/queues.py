"""A consumer's queue hash (``P:{G}:q`` or ``P:{G}:q:<clientId>``) read into typed states."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import QUEUE_FIELDS


@dataclass(frozen=True, slots=True)
class QueueState:
    topic: str
    queue: str
    max_offset: int
    committed: int
    lock_ms: int
    token: int
    access_ms: int
    address: str
    checkpointed: int = -1  # the offset last copied to the broker's consumer group, -1 none
    has_offset: bool = True  # False: no committed offset stored (``committed`` reads 0)


def parse_queue_hash(fields: dict[str, str]) -> list[QueueState]:
    """Group ``topic:queue:attr`` fields into one :class:`QueueState` per queue, sorted by topic
    and queue (numeric ids in numeric order). Raises ValueError for a value that is no integer."""
    grouped: dict[tuple[str, str], dict[str, str]] = {}
    for name, value in fields.items():
        head, _, attr = name.rpartition(":")
        topic, _, queue = head.rpartition(":")
        if attr in QUEUE_FIELDS and topic:
            grouped.setdefault((topic, queue), {})[attr] = value
    out = []
    for (topic, queue), f in sorted(grouped.items(), key=lambda kv: (kv[0][0], _qsort(kv[0][1]))):
        out.append(QueueState(topic, queue, int(f.get("max", 0)), int(f.get("com", 0)),
                              int(f.get("lock", 0)), int(f.get("tok", 0)), int(f.get("acc", 0)),
                              f.get("addr", ""), int(f.get("ckp", -1)), "com" in f))
    return out


def _qsort(q: str) -> tuple[int, str]:
    return (int(q), "") if q.isdigit() else (1 << 62, q)
