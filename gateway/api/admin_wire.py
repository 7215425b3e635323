"""The admin API's JSON (besides registrations: ``registry_wire``): API keys, resets, dead
letters and redrives, topics, pause and backlog answers.

Only the wire modules know the camelCase field names.
"""

from __future__ import annotations

from typing import Any

from ..core.auth import KeyRecord
from ..core.deadletters import DeadPage, RedriveTarget
from ..core.errors import invalid
from ..core.names import check_name
from ..core.reset import ResetRequest, ResetResult
from ..core.topics import Topic
from .consume_wire import encode_records
from .http import queue_json, queue_param
from .numbers import json_int
from .produce_wire import MAX_PARTITION, partition_number
from .registry_wire import check_names

#: Query parameters (and the redrive's body fields) of the admin operations that take any.
DELETE_OFFSETS = "deleteOffsets"  # DELETE /admin/consumers/{c}: its offsets go too
DELETE_PARAMS = frozenset({DELETE_OFFSETS})
BACKLOG_PARAMS = frozenset({"consumer", "age"})
ALERTS_PARAMS = frozenset({"all"})
DEAD_PARAMS = frozenset({"limit", "partition", "queue", "offset", "encoding"})
REDRIVE_FIELDS = frozenset({"partition", "queue", "toOffset", "limit", "target"})
TOPIC_LIST_PARAMS = frozenset({"internal"})
_TOPIC_FIELDS = frozenset({"name", "partitions", "replicationFactor"})
_KEY_FIELDS = frozenset({"name", "admin", "producers", "consumers"})

def key_request(body: dict[str, Any]) -> tuple[str, bool, list[str], list[str]]:
    """``POST /admin/keys``: (name, admin, producers, consumers); the grant must not be empty."""
    extra = set(body) - _KEY_FIELDS
    if extra:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    name = check_name(body.get("name"), "name")
    is_admin = body.get("admin", False)
    if type(is_admin) is not bool:
        raise invalid("invalid_admin", "admin must be true or false")
    producers = check_names(body.get("producers"), "producers")
    consumers = check_names(body.get("consumers"), "consumers")
    if not (is_admin or producers or consumers):
        raise invalid("empty_grant", "a key needs admin, producers or consumers")
    return name, is_admin, producers, consumers


def key_body(rec: KeyRecord) -> dict[str, Any]:
    """An API key's record as the admin API shows it (never its digest)."""
    return {"id": rec.id, "name": rec.name, "admin": rec.admin, "producers": rec.producers,
            "consumers": rec.consumers, "createdMs": rec.created_ms}


_RESET_FIELDS = {"topic": "topic", "to": "to", "timestamp": "timestamp", "offset": "offset",
                 "queue": "queue", "clientId": "client_id", "dryRun": "dry_run"}


def reset_request(body: dict[str, Any]) -> ResetRequest:
    """``POST /admin/consumers/{c}/reset``'s body; its values are checked by the reset itself."""
    extra = set(body) - set(_RESET_FIELDS)
    if extra:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    for k in ("queue", "timestamp", "offset"):  # a null queue would widen the reset to all
        if k in body and body[k] is None:  # queues, which cannot be undone: say so instead
            raise invalid(f"invalid_{k}", f"{k} must not be null: leave it out"
                              + (" to reset every queue of the topic" if k == "queue" else ""))
    values = {_RESET_FIELDS[k]: v for k, v in body.items()}
    # 100.0 is an integer to JSON Schema, so to this API (a queue may be given as its number)
    for k in ("timestamp", "offset", "queue"):
        if (n := json_int(values.get(k))) is not None:
            values[k] = n
    return ResetRequest(**values)


def reset_body(r: ResetResult) -> dict[str, Any]:
    return {"consumer": r.consumer, "topic": r.topic, "to": r.to, "moved": r.moved,
            **({"dryRun": True} if r.dry_run else {}),
            "queues": [{"clientId": m.client_id, "queue": m.queue, "from": m.before, "to": m.after}
                       for m in r.queues]}


def dead_page_body(p: DeadPage, encoding: str) -> dict[str, Any]:
    records = encode_records([r for _, r in p.records], encoding, retried=True)
    for (queue, _), out in zip(p.records, records, strict=True):
        out.update(queue_json(queue))
    return {
        "consumer": p.consumer, "deadLetterTopic": p.topic, "exists": p.exists, "count": p.count,
        "oldestMs": p.oldest_ms if p.oldest_ms >= 0 else None,
        "partitions": [{**queue_json(q.queue), "redrivenOffset": q.redriven, "endOffset": q.high,
                        "count": q.count} for q in p.queues],
        "messages": records,
    }


def redrive_request(body: dict[str, Any]) -> tuple[RedriveTarget, str | None, int | None,
                                                   int | None]:
    """(target, partition, toOffset, limit) of a redrive; all optional."""
    raw = body.get("target")
    try:
        target = RedriveTarget("consumer" if raw is None else raw if isinstance(raw, str) else "?")
    except ValueError:
        raise invalid("invalid_target", "target must be 'consumer' (its retry topic) or "
                          "'topic' (the topic it was produced to)") from None
    partition: str | None = None
    if body.get("partition") is not None:
        n = json_int(body["partition"])
        if not partition_number(n):
            raise invalid("invalid_partition", f"partition must be an integer from 0 to "
                              f"{MAX_PARTITION}", parameter="partition", min=0, max=MAX_PARTITION)
        partition = str(n)
    partition = queue_param(body.get("queue"), partition)
    to_offset = _count(body, "toOffset", "invalid_to_offset", 0)
    limit = _count(body, "limit", "invalid_limit", 1)
    return target, partition, to_offset, limit


def _count(body: dict[str, Any], name: str, code: str, lo: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    n = json_int(v)
    if n is None or n < lo:
        raise invalid(code, f"{name} must be an integer of at least {lo}")
    return n


def redriven_body(consumer: str, dead_letter_topic: str, target: RedriveTarget, moved: int) -> dict[str, Any]:
    return {"consumer": consumer, "deadLetterTopic": dead_letter_topic, "target": target.value,
            "redriven": moved}


def paused_body(consumer: str, paused: bool, created: bool) -> dict[str, Any]:
    """``POST /admin/consumers/{c}/pause|resume``; ``created``: the name was registered by it."""
    return {"consumer": consumer, "paused": paused, **({"created": True} if created else {})}


def backlog_body(rows: list[dict[str, Any]], generated_ms: int,
                 staleness: dict[str, Any] | None = None) -> dict[str, Any]:
    """The backlog view; ``staleness``: how old its figures are (ops/backlog.py)."""
    return {"consumers": rows, "generatedMs": generated_ms, **(staleness or {})}


def topic_request(body: dict[str, Any]) -> tuple[Any, int, int | None]:
    """``POST /admin/topics``: (name, partitions, replication factor or None for the broker's
    default); the name and the numbers' ranges are checked by the topic service."""
    unknown = set(body) - _TOPIC_FIELDS
    if unknown:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(unknown))} "
                      f"(a topic takes {', '.join(sorted(_TOPIC_FIELDS))})")
    if body.get("partitions") is None:
        raise invalid("missing_partitions", "partitions is required")
    partitions = json_int(body["partitions"])
    if partitions is None:
        raise invalid("invalid_partitions", "partitions must be an integer")
    replication: int | None = None
    if body.get("replicationFactor") is not None:
        replication = json_int(body["replicationFactor"])
        if replication is None:
            raise invalid("invalid_replication_factor",
                          "replicationFactor must be an integer, or null for the broker's default")
    return body.get("name"), partitions, replication


def topic_body(t: Topic) -> dict[str, Any]:
    """A topic with its partitions: replicas and watermarks (``null`` where the broker could not
    tell: no leader, or a partition whose offsets did not answer)."""
    return {
        "name": t.name,
        "internal": t.internal,
        "partitionCount": len(t.queues),
        "replicationFactor": t.replication,
        "partitions": [{
            **queue_json(q.queue),
            "leader": q.leader if q.leader >= 0 else None,
            "replicas": list(q.replicas),
            "inSync": list(q.in_sync),
            "earliestOffset": q.low if q.low >= 0 else None,
            "endOffset": q.high if q.high >= 0 else None,
        } for q in t.queues],
    }
