"""Registered consumers and producers, held in Redis so every node sees a change at once.

A consumer's registration is its config hash ``P:{G}:cfg``, the hash the choose and ack
scripts already read: registering, pausing or rate-limiting a consumer is one write there,
and the next ``/message`` on any node obeys it without a reload. Producers are entries of
``P:{reg}:producers`` (name -> JSON), read by the produce check script. The reads and writes
are the store's (``gateway.store.registry``); this module validates and shapes them.

The API speaks camelCase JSON; the hash keeps short snake_case fields for the scripts.
"""

from __future__ import annotations

from typing import Any

from ..config import Settings
from ..store import OffsetStore, now_ms
from .errors import bad_request, not_found
from .names import check_name, check_topic

MODES = ("cluster", "broadcast")
#: Fields of the consumer API, and every hash field each one owns (PUT replaces all of them).
_FIELDS: dict[str, tuple[str, ...]] = {
    "topics": ("topics",), "mode": ("mode",), "consumeTimeoutMs": ("consume_timeout_ms",),
    "maxBatch": ("max_batch",), "start": ("start",), "paused": ("paused",),
    "rateLimit": ("rate", "burst"),
    "retry": ("retry_max_attempts", "retry_initial_delay_ms", "retry_multiplier",
              "retry_max_delay_ms", "retry_dead_letter_topic"),
    "alerts": ("alert_backlog", "alert_age_ms"),
}
_RETRY = {"maxAttempts": ("retry_max_attempts", 1, 1000),
          "initialDelayMs": ("retry_initial_delay_ms", 0, 2**40),
          "multiplier": ("retry_multiplier", 1, 100), "maxDelayMs": ("retry_max_delay_ms", 0, 2**40)}
_ALERTS = {"backlogMessages": ("alert_backlog", 1, 2**62), "oldestAgeMs": ("alert_age_ms", 1, 2**40)}


def _object(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise bad_request(f"invalid_{what}", f"{what} must be an object")
    return v


def _number(v: Any, code: str, name: str, lo: float, hi: float, integer: bool = True) -> float:
    ok = type(v) is int or (not integer and type(v) is float)
    if not ok or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise bad_request(code, f"{name} must be {kind} between {lo} and {hi}", min=lo, max=hi)
    n: float = v  # an int stays an int (str() of it has no ".0")
    return n


def _topics(v: Any) -> list[str]:
    if not isinstance(v, list) or not v:
        raise bad_request("invalid_topics", "topics must be a non-empty array of topic names")
    return sorted({check_topic(t) for t in v})


def consumer_fields(body: dict[str, Any]) -> dict[str, str | None]:
    """Validate API fields into hash fields; None deletes a field (an API ``null``)."""
    extra = set(body) - set(_FIELDS)
    if extra:
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    out: dict[str, str | None] = {}
    for name, value in body.items():
        if value is None:
            out.update(dict.fromkeys(_FIELDS[name]))
            continue
        if name == "topics":
            out["topics"] = "," + ",".join(_topics(value)) + ","
        elif name == "mode":
            if value not in MODES:
                raise bad_request("invalid_mode", "mode must be 'cluster' or 'broadcast'")
            out["mode"] = value
        elif name == "consumeTimeoutMs":
            out["consume_timeout_ms"] = str(_number(value, "invalid_consume_timeout_ms", name, 100,
                                                    86_400_000))
        elif name == "maxBatch":
            out["max_batch"] = str(_number(value, "invalid_max_batch", name, 1, 1_000_000))
        elif name == "start":
            if value not in ("latest", "earliest"):
                raise bad_request("invalid_start", "start must be 'latest' or 'earliest'")
            out["start"] = value
        elif name == "paused":
            if type(value) is not bool:
                raise bad_request("invalid_paused", "paused must be true or false")
            out["paused"] = "1" if value else "0"
        elif name == "rateLimit":
            v = _object(value, "rate_limit")
            if set(v) - {"messagesPerSecond", "burst"}:
                raise bad_request("unknown_field", "rateLimit takes messagesPerSecond and burst")
            rate = _number(v.get("messagesPerSecond"), "invalid_rate_limit",
                           "rateLimit.messagesPerSecond", 0.001, 1e9, integer=False)
            out["rate"] = repr(float(rate))
            out["burst"] = (str(_number(v["burst"], "invalid_rate_limit", "rateLimit.burst", 1, 10**9))
                            if v.get("burst") is not None else None)
        elif name == "retry":
            v = _object(value, "retry")
            if set(v) - set(_RETRY) - {"deadLetterTopic"}:
                raise bad_request("unknown_field", f"retry takes {', '.join([*_RETRY, 'deadLetterTopic'])}")
            for k, (f, lo, hi) in _RETRY.items():
                out[f] = str(_number(v[k], "invalid_retry", f"retry.{k}", lo, hi,
                                     integer=k != "multiplier")) if v.get(k) is not None else None
            dlq = v.get("deadLetterTopic")
            out["retry_dead_letter_topic"] = check_topic(dlq) if dlq is not None else None
        elif name == "alerts":
            v = _object(value, "alerts")
            if set(v) - set(_ALERTS):
                raise bad_request("unknown_field", f"alerts takes {', '.join(_ALERTS)}")
            for k, (f, lo, hi) in _ALERTS.items():
                out[f] = str(_number(v[k], "invalid_alerts", f"alerts.{k}", lo, hi)) \
                    if v.get(k) is not None else None
    return out


def consumer_view(group: str, cfg: dict[str, str], settings: Settings) -> dict[str, Any]:
    """The API form of a config hash, with the gateway's defaults filled in."""
    def num(f: str) -> int | None:
        return int(cfg[f]) if cfg.get(f) else None

    rate = float(cfg["rate"]) if cfg.get("rate") else None
    retry: dict[str, Any] = {k: (float(cfg[f]) if k == "multiplier" else int(cfg[f]))
             for k, (f, _, _) in _RETRY.items() if cfg.get(f)}
    if cfg.get("retry_dead_letter_topic"):
        retry["deadLetterTopic"] = cfg["retry_dead_letter_topic"]
    alerts = {k: int(cfg[f]) for k, (f, _, _) in _ALERTS.items() if cfg.get(f)}
    topics = [t for t in cfg.get("topics", "").split(",") if t]
    return {
        "consumer": group,
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
        "createdMs": num("created_ms"),
        "updatedMs": num("updated_ms"),
    }


class Registry:
    def __init__(self, store: OffsetStore, settings: Settings) -> None:
        self.store = store
        self.records = store.registry
        self.settings = settings

    # -- consumers ---------------------------------------------------------------------------
    async def config(self, group: str) -> dict[str, str]:
        return await self.records.config(group)

    async def get_consumer(self, group: str) -> dict[str, Any]:
        cfg = await self.config(group)
        if not cfg:
            raise not_found("unknown_consumer", f"consumer {group!r} is not registered and has no settings")
        return consumer_view(group, cfg, self.settings)

    async def put_consumer(self, group: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Register (or re-register) with exactly ``body``; returns (view, created)."""
        if body.get("topics") is None:
            raise bad_request("missing_topics" if "topics" not in body else "invalid_topics",
                              "topics is required to register a consumer")
        fields = consumer_fields(body)
        if fields.get("mode") is None:  # left out or null: the default, never "no mode"
            fields["mode"] = "cluster"
        old = await self.config(group)
        now = str(now_ms())
        values = {k: v for k, v in fields.items() if v is not None}
        values.update(registered="1", updated_ms=now, created_ms=old.get("created_ms") or now)
        await self.records.replace_config(group, values)
        await self.records.add_registered(group)
        return consumer_view(group, values, self.settings), not old.get("registered")

    async def patch_consumer(self, group: str, body: dict[str, Any]) -> dict[str, Any]:
        """Change only the given fields (null clears one); works for open-mode consumers too."""
        fields = consumer_fields(body)
        cfg = await self.config(group)
        if not cfg and not self.settings.open_mode:
            raise not_found("unknown_consumer", f"consumer {group!r} is not registered")
        if cfg.get("registered") == "1":
            for f in ("topics", "mode"):
                if f in fields and fields[f] is None:
                    raise bad_request(f"invalid_{f}", f"a registered consumer needs {f}")
        elif {"topics", "mode"} & set(fields):  # only a registration holds a consumer to them
            raise bad_request("registration_required", f"consumer {group!r} is not registered: "
                              "topics and mode are enforced only for registered consumers "
                              f"(PUT /admin/consumers/{group})")
        sets = {k: v for k, v in fields.items() if v is not None}
        sets["updated_ms"] = str(now_ms())
        await self.records.update_config(group, sets, [k for k, v in fields.items() if v is None])
        if cfg.get("registered") != "1":  # settings of an open-mode name: list it (and watch
            await self.records.mark_seen(group)  # its alert thresholds)
        return consumer_view(group, await self.config(group), self.settings)

    async def require_known(self, group: str) -> dict[str, str]:
        """The consumer's config; 404 unless it is registered or open mode serves it, so that an
        operator's typo fails instead of pausing or resetting a name nobody consumes as."""
        cfg = await self.config(group)
        if cfg.get("registered") != "1" and not self.settings.open_mode:
            raise not_found("unknown_consumer", f"consumer {group!r} is not registered")
        return cfg

    async def set_paused(self, group: str, paused: bool) -> None:
        cfg = await self.require_known(group)
        await self.store.set_config(group, {"paused": "1" if paused else "0", "updated_ms": now_ms()})
        if cfg.get("registered") != "1":  # as patch_consumer: an open-mode name with settings is listed
            await self.records.mark_seen(group)

    async def delete_consumer(self, group: str, delete_offsets: bool) -> dict[str, Any]:
        """Unregister: settings and rate bucket go; offsets too if asked. Key grants stay with
        their keys (revoke the key to remove them)."""
        existed, deleted = await self.records.delete_consumer(group, delete_offsets)
        return {"consumer": group, "unregistered": existed, "offsetsDeleted": delete_offsets,
                "keysDeleted": deleted}

    async def consumer_names(self) -> tuple[set[str], set[str]]:
        """(registered, seen in open mode) consumer names."""
        return await self.records.consumer_names()

    async def list_consumers(self) -> list[dict[str, Any]]:
        reg, seen = await self.consumer_names()
        out = []
        for g in sorted(reg | seen):
            out.append(consumer_view(g, await self.config(g), self.settings))
        return out

    # -- producers ---------------------------------------------------------------------------
    async def put_producer(self, name: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        extra = set(body) - {"topics"}
        if extra:
            raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
        if "topics" not in body:
            raise bad_request("missing_topics", "topics is required to register a producer")
        topics = _topics(body["topics"])
        old = await self.get_producer(name, missing_ok=True)
        now = now_ms()
        rec = {"producer": name, "topics": topics, "createdMs": old["createdMs"] if old else now,
               "updatedMs": now}
        await self.records.put_producer(name, rec)
        return rec, old is None

    async def get_producer(self, name: str, missing_ok: bool = False) -> dict[str, Any] | None:
        rec = await self.records.producer(name)
        if rec is None and not missing_ok:
            raise not_found("unknown_producer", f"producer {name!r} is not registered")
        return rec

    async def list_producers(self) -> list[dict[str, Any]]:
        return sorted(await self.records.producers(), key=lambda r: r["producer"])

    async def delete_producer(self, name: str) -> dict[str, Any]:
        if not await self.records.delete_producer(name):
            raise not_found("unknown_producer", f"producer {name!r} is not registered")
        return {"producer": name, "unregistered": True}


def check_names(v: Any, what: str) -> list[str]:
    """A list of consumer or producer names (for key grants)."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad_request(f"invalid_{what}", f"{what} must be an array of names")
    return [check_name(x, what[:-1]) for x in v]

