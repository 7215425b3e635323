"""The admin API's JSON for registrations: camelCase fields in and out.

A consumer's API fields map onto short snake_case fields of its config hash (what the Lua
scripts read); :func:`consumer_fields` validates the one into the other and
:func:`consumer_view` shows a hash as the API does, with the gateway's defaults filled in.
"""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..core.errors import invalid
from ..core.names import check_name, check_topic
from ..core.registry import MAX_SHARDS, ConsumerRecord, DeleteResult, ProducerRecord
from .numbers import json_int

MODES = ("cluster", "broadcast")
#: Fields of the consumer API, and every hash field each one owns (PUT replaces all of them).
_FIELDS: dict[str, tuple[str, ...]] = {
    "topics": ("topics",), "mode": ("mode",), "consumeTimeoutMs": ("consume_timeout_ms",),
    "maxBatch": ("max_batch",), "start": ("start",), "paused": ("paused",),
    "rateLimit": ("rate", "burst"),
    "retry": ("retry_max_attempts", "retry_initial_delay_ms", "retry_multiplier",
              "retry_max_delay_ms", "retry_delays_ms", "retry_dead_letter_topic"),
    "alerts": ("alert_backlog", "alert_age_ms"), "shards": ("shards",),
}
_RETRY = {"maxAttempts": ("retry_max_attempts", 1, 1000),
          "initialDelayMs": ("retry_initial_delay_ms", 0, 2**40),
          "multiplier": ("retry_multiplier", 1, 100), "maxDelayMs": ("retry_max_delay_ms", 0, 2**40)}
_ALERTS = {"backlogMessages": ("alert_backlog", 1, 2**62), "oldestAgeMs": ("alert_age_ms", 1, 2**40)}


def _object(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise invalid(f"invalid_{what}", f"{what} must be an object")
    return v


def _number(v: Any, code: str, name: str, lo: float, hi: float, integer: bool = True) -> float:
    n: float | None = json_int(v) if integer else (v if type(v) in (int, float) else None)
    if n is None or not lo <= n <= hi:
        kind = "an integer" if integer else "a number"
        raise invalid(code, f"{name} must be {kind} between {lo} and {hi}", min=lo, max=hi)
    return n  # an int stays an int (str() of it has no ".0")


def _topics(v: Any) -> list[str]:
    if not isinstance(v, list) or not v:
        raise invalid("invalid_topics", "topics must be a non-empty array of topic names")
    return sorted({check_topic(t) for t in v})


def _delays(v: Any) -> str | None:
    """``retry.delaysMs``: the delay before each retry (seed 001's schedule), stored as a list."""
    if v is None:
        return None
    if not isinstance(v, list) or not 1 <= len(v) <= 100:
        raise invalid("invalid_retry", "retry.delaysMs must be an array of 1-100 delays (ms)")
    return ",".join(str(_number(d, "invalid_retry", "retry.delaysMs[]", 0, 2**40)) for d in v)


def consumer_fields(body: dict[str, Any], whole: bool = False) -> dict[str, str | None]:
    """Validate API fields into hash fields; None deletes a field (an API ``null``).

    Only what the body names: inside ``rateLimit``, ``retry`` and ``alerts`` too, so that a
    PATCH of ``{"retry": {"maxAttempts": 3}}`` keeps the schedule and the dead-letter topic (a
    JSON merge patch, RFC 7396). ``whole`` (PUT, which replaces the hash anyway) also requires
    ``rateLimit.messagesPerSecond``."""
    extra = set(body) - set(_FIELDS)
    if extra:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    out: dict[str, str | None] = {}
    for name, value in body.items():
        if value is None:
            out.update(dict.fromkeys(_FIELDS[name]))
            continue
        if name == "topics":
            out["topics"] = "," + ",".join(_topics(value)) + ","
        elif name == "mode":
            if value not in MODES:
                raise invalid("invalid_mode", "mode must be 'cluster' or 'broadcast'")
            out["mode"] = value
        elif name == "consumeTimeoutMs":
            out["consume_timeout_ms"] = str(_number(value, "invalid_consume_timeout_ms", name, 100,
                                                    86_400_000))
        elif name == "shards":
            out["shards"] = str(_number(value, "invalid_shards", name, 1, MAX_SHARDS))
        elif name == "maxBatch":
            out["max_batch"] = str(_number(value, "invalid_max_batch", name, 1, 1_000_000))
        elif name == "start":
            if value not in ("latest", "earliest"):
                raise invalid("invalid_start", "start must be 'latest' or 'earliest'")
            out["start"] = value
        elif name == "paused":
            if type(value) is not bool:
                raise invalid("invalid_paused", "paused must be true or false")
            out["paused"] = "1" if value else "0"
        elif name == "rateLimit":
            v = _object(value, "rate_limit")
            if set(v) - {"messagesPerSecond", "burst"}:
                raise invalid("unknown_field", "rateLimit takes messagesPerSecond and burst")
            if whole and v.get("messagesPerSecond") is None:
                raise invalid("invalid_rate_limit", "rateLimit needs messagesPerSecond")
            if "messagesPerSecond" in v:
                rate = v["messagesPerSecond"]
                out["rate"] = None if rate is None else repr(float(_number(
                    rate, "invalid_rate_limit", "rateLimit.messagesPerSecond", 0.001, 1e9,
                    integer=False)))
            if "burst" in v:
                out["burst"] = None if v["burst"] is None else str(_number(
                    v["burst"], "invalid_rate_limit", "rateLimit.burst", 1, 10**9))
        elif name == "retry":
            v = _object(value, "retry")
            if set(v) - set(_RETRY) - {"delaysMs", "deadLetterTopic"}:
                raise invalid("unknown_field", "retry takes "
                              f"{', '.join([*_RETRY, 'delaysMs', 'deadLetterTopic'])}")
            for k, (f, lo, hi) in _RETRY.items():
                if k in v:
                    out[f] = str(_number(v[k], "invalid_retry", f"retry.{k}", lo, hi,
                                         integer=k != "multiplier")) if v[k] is not None else None
            if "delaysMs" in v:
                out["retry_delays_ms"] = _delays(v["delaysMs"])
            if "deadLetterTopic" in v:
                dlq = v["deadLetterTopic"]
                out["retry_dead_letter_topic"] = check_topic(dlq) if dlq is not None else None
        elif name == "alerts":
            v = _object(value, "alerts")
            if set(v) - set(_ALERTS):
                raise invalid("unknown_field", f"alerts takes {', '.join(_ALERTS)}")
            for k, (f, lo, hi) in _ALERTS.items():
                if k in v:
                    out[f] = str(_number(v[k], "invalid_alerts", f"alerts.{k}", lo, hi)) \
                        if v[k] is not None else None
    return out


def consumer_view(consumer: str, cfg: dict[str, str], settings: Settings) -> dict[str, Any]:
    """The API form of a config hash, with the gateway's defaults filled in."""
    def num(f: str) -> int | None:
        return int(cfg[f]) if cfg.get(f) else None

    rate = float(cfg["rate"]) if cfg.get("rate") else None
    retry: dict[str, Any] = {k: (float(cfg[f]) if k == "multiplier" else int(cfg[f]))
             for k, (f, _, _) in _RETRY.items() if cfg.get(f)}
    if cfg.get("retry_delays_ms"):
        retry["delaysMs"] = [int(d) for d in cfg["retry_delays_ms"].split(",")]
    if cfg.get("retry_dead_letter_topic"):
        retry["deadLetterTopic"] = cfg["retry_dead_letter_topic"]
    alerts = {k: int(cfg[f]) for k, (f, _, _) in _ALERTS.items() if cfg.get(f)}
    topics = [t for t in cfg.get("topics", "").split(",") if t]
    return {
        "consumer": consumer,
        "registered": cfg.get("registered") == "1",
        "topics": topics or None,
        "mode": cfg.get("mode"),
        "consumeTimeoutMs": num("consume_timeout_ms") or settings.consume_timeout_ms,
        "maxBatch": num("max_batch") or settings.max_messages,
        "start": cfg.get("start") or settings.start_position,
        "paused": cfg.get("paused") == "1",
        "rateLimit": ({"messagesPerSecond": rate, "burst": num("burst") or max(1, int(rate))}
                      if rate else None),
        "retry": retry or None,
        "alerts": alerts or None,
        "shards": num("shards") or 1,
        "createdMs": num("created_ms"),
        "updatedMs": num("updated_ms"),
    }



def consumer_body(rec: ConsumerRecord, settings: Settings) -> dict[str, Any]:
    """A consumer as the API shows it; ``created: true`` only when this write made it."""
    body = consumer_view(rec.name, rec.fields, settings)
    if rec.created:
        body["created"] = True
    return body


def registration_fields(body: dict[str, Any]) -> dict[str, str | None]:
    """A PUT's body: topics are required to register."""
    if body.get("topics") is None:
        raise invalid("missing_topics" if "topics" not in body else "invalid_topics",
                      "topics is required to register a consumer")
    return consumer_fields(body, whole=True)


def delete_body(r: DeleteResult) -> dict[str, Any]:
    return {"consumer": r.consumer, "unregistered": r.unregistered,
            "offsetsDeleted": r.offsets_deleted, "keysDeleted": r.keys_deleted}


def producer_topics(body: dict[str, Any]) -> list[str]:
    """A producer registration's body: exactly its topics."""
    extra = set(body) - {"topics"}
    if extra:
        raise invalid("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    if "topics" not in body:
        raise invalid("missing_topics", "topics is required to register a producer")
    return _topics(body["topics"])


def producer_body(rec: ProducerRecord) -> dict[str, Any]:
    return {"producer": rec.name, "topics": rec.topics, "createdMs": rec.created_ms,
            "updatedMs": rec.updated_ms}


def check_names(v: Any, what: str) -> list[str]:
    """A list of consumer or producer names (for key grants)."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise invalid(f"invalid_{what}", f"{what} must be an array of names")
    return [check_name(x, what[:-1]) for x in v]

