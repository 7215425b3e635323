"""Admin API routes (``/admin/...``): registry, keys, pause/resume, resets, backlog and alerts.

Every route here requires an admin key when auth is on. Each change is a Redis write that
the next request on every node reads, so there is no reload window.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..core import reset as reset_offsets
from ..core.errors import bad_request, not_found
from ..core.names import check_name, check_public_topic, internal_topic_prefixes
from ..ops import backlog
from ..store import now_ms
from .access import route
from .numbers import query_int
from .registry_wire import (
    check_names,
    consumer_body,
    consumer_fields,
    delete_body,
    producer_body,
    producer_topics,
    registration_fields,
)
from .routes import JSON, NO_PARAMS, api_credential, check_query, read_json
from .wire import MAX_PARTITION, dead_page_body, key_body, redrive_request, reset_body, reset_request


def _gw(request: Request) -> Any:
    return request.app.state.gw


async def _admin(request: Request) -> Any:
    gw = _gw(request)
    await gw.auth.require_admin(api_credential(request))
    return gw


async def _object_body(request: Request, gw: Any) -> dict[str, Any]:
    body = await read_json(request, gw.settings.max_body_bytes, required=True)
    if not isinstance(body, dict):
        raise bad_request("invalid_body", "request body must be a JSON object")
    return body


#: The query parameters of the admin operations that take any; check_query refuses others.
_DELETE_PARAMS = frozenset({"deleteOffsets"})
_BACKLOG_PARAMS = frozenset({"consumer", "age"})
_ALERTS_PARAMS = frozenset({"all"})


def _flag(request: Request, name: str, default: bool = False) -> bool:
    raw = request.query_params.get(name, "true" if default else "false").lower()
    if raw not in ("true", "false", "1", "0"):
        code = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        raise bad_request(f"invalid_{code}", f"{name} must be true or false")
    return raw in ("true", "1")


# -- consumers -------------------------------------------------------------------------------
async def consumers_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    return JSON({"consumers": [consumer_body(r, gw.settings) for r in await gw.registry.list_consumers()]})


async def consumer_route(request: Request) -> Response:
    gw = await _admin(request)
    group = check_name(request.path_params["group"], "consumer",
                       internal_ok=request.method == "GET")
    if request.method == "GET":
        return JSON(consumer_body(await gw.registry.get_consumer(group), gw.settings))
    if request.method == "DELETE":
        check_query(request, _DELETE_PARAMS)
        return JSON(delete_body(await gw.registry.delete_consumer(group, _flag(request, "deleteOffsets"))))
    check_query(request, NO_PARAMS)
    body = await _object_body(request, gw)
    if request.method == "PUT":
        rec, created = await gw.registry.put_consumer(group, registration_fields(body))
        return JSON(consumer_body(rec, gw.settings), status_code=201 if created else 200)
    rec = await gw.registry.patch_consumer(group, consumer_fields(body))
    return JSON(consumer_body(rec, gw.settings))


async def pause_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    group = check_name(request.path_params["group"], "consumer")
    paused = request.url.path.endswith("/pause")
    created = await gw.registry.set_paused(group, paused)
    return JSON({"consumer": group, "paused": paused, **({"created": True} if created else {})})


async def reset_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    group = check_name(request.path_params["group"], "consumer")
    body = await _object_body(request, gw)
    cfg, created = await gw.registry.writable(group)  # 404 for an unknown name comes first
    req = reset_request(body)
    check_public_topic(req.topic, internal_topic_prefixes(gw.settings))
    result = await reset_offsets.reset(gw.store, gw.broker, group, req, cfg, gw.settings.client_idle_ms,
                                       gw.checkpoints)
    return JSON({**reset_body(result), **({"created": True} if created else {})})


# -- dead letters ----------------------------------------------------------------------------
_DEAD_PARAMS = frozenset({"limit", "partition", "offset", "encoding"})
_REDRIVE_FIELDS = frozenset({"partition", "toOffset", "limit", "target"})


def _query_number(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    n = query_int(raw)
    if n is None or not lo <= n <= hi:
        raise bad_request(f"invalid_{name}", f"{name} must be an integer from {lo} to {hi}",
                          parameter=name, min=lo, max=hi)
    return n


async def dead_letters_route(request: Request) -> Response:
    """GET: count, age and a page of the consumer's dead letters not yet redriven."""
    gw = await _admin(request)
    group = check_name(request.path_params["group"], "consumer")
    check_query(request, _DEAD_PARAMS)
    await gw.registry.require_seen(group)
    encoding = request.query_params.get("encoding", "utf8")
    if encoding not in ("utf8", "base64"):
        raise bad_request("invalid_encoding", "encoding must be 'utf8' or 'base64'")
    partition = _query_number(request, "partition", None, 0, MAX_PARTITION)
    page = await gw.dead_letters.page(
        group, _query_number(request, "limit", 20, 0, 1000),
        str(partition) if partition is not None else None,
        _query_number(request, "offset", None, 0, 2**63 - 1))
    return JSON(dead_page_body(page, encoding))


async def redrive_route(request: Request) -> Response:
    """POST: send the oldest dead letters not yet redriven back, all or a range."""
    gw = await _admin(request)
    group = check_name(request.path_params["group"], "consumer")
    body = await read_json(request, gw.settings.max_body_bytes)
    if not isinstance(body, dict):
        raise bad_request("invalid_body", "request body must be a JSON object")
    check_query(request, _REDRIVE_FIELDS, body=body)
    await gw.registry.require_known(group)
    await gw.registry.require_seen(group)  # in open mode too: a never-seen name has none
    target, partition, to_offset, limit = redrive_request(body)
    moved = await gw.dead_letters.redrive(group, target, partition, to_offset, limit)
    return JSON({"consumer": group, "deadLetterTopic": await gw.dead_letters.topic_of(group),
                 "target": target.value, "redriven": moved})


# -- producers -------------------------------------------------------------------------------
async def producers_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    return JSON({"producers": [producer_body(r) for r in await gw.registry.list_producers()]})


async def producer_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    name = check_name(request.path_params["name"], "producer")
    if request.method == "GET":
        rec = await gw.registry.get_producer(name)
        assert rec is not None  # not missing_ok: an unknown producer raised
        return JSON(producer_body(rec))
    if request.method == "DELETE":
        await gw.registry.delete_producer(name)
        return JSON({"producer": name, "unregistered": True})
    rec, created = await gw.registry.put_producer(name, producer_topics(await _object_body(request, gw)))
    return JSON(producer_body(rec), status_code=201 if created else 200)


# -- API keys --------------------------------------------------------------------------------
async def keys_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    if request.method == "GET":
        return JSON({"keys": [key_body(r) for r in await gw.keys.all()]})
    body = await _object_body(request, gw)
    extra = set(body) - {"name", "admin", "producers", "consumers"}
    if extra:
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(extra))}")
    name = check_name(body.get("name"), "name")
    is_admin = body.get("admin", False)
    if type(is_admin) is not bool:
        raise bad_request("invalid_admin", "admin must be true or false")
    producers = check_names(body.get("producers"), "producers")
    consumers = check_names(body.get("consumers"), "consumers")
    if not (is_admin or producers or consumers):
        raise bad_request("empty_grant", "a key needs admin, producers or consumers")
    key, rec = await gw.keys.create(name, admin=is_admin, producers=producers, consumers=consumers)
    return JSON({**key_body(rec), "key": key}, status_code=201)


async def key_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    key_id = request.path_params["key_id"]
    rec = await (gw.keys.revoke(key_id) if request.method == "DELETE" else gw.keys.get(key_id))
    if rec is None:
        raise not_found("unknown_key", f"no API key with id {key_id!r}")
    return JSON({**key_body(rec), "revoked": True} if request.method == "DELETE" else key_body(rec))


# -- backlog and alerts ----------------------------------------------------------------------
async def backlog_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, _BACKLOG_PARAMS, lists=frozenset({"consumer"}))
    names = [check_name(c, "consumer", internal_ok=True) for c in request.query_params.getlist("consumer")]
    for name in names:  # a typo is told, not shown as an empty row
        await gw.registry.require_seen(name)
    rows = await backlog.collect(gw, names or None, with_age=_flag(request, "age", default=True))
    return JSON({"consumers": rows, "generatedMs": now_ms()})


async def alerts_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, _ALERTS_PARAMS)
    include_all = _flag(request, "all")
    if request.method == "POST":  # /admin/alerts/evaluate
        await gw.alerts.evaluate_now()
    return JSON(await gw.alerts.view(include_all=include_all))


admin_routes = [
    route("/admin/consumers", consumers_route, methods=["GET"]),
    route("/admin/consumers/{group}", consumer_route, methods=["GET", "PUT", "PATCH", "DELETE"]),
    route("/admin/consumers/{group}/pause", pause_route, methods=["POST"]),
    route("/admin/consumers/{group}/resume", pause_route, methods=["POST"]),
    route("/admin/consumers/{group}/reset", reset_route, methods=["POST"]),
    route("/admin/consumers/{group}/dead-letters", dead_letters_route, methods=["GET"]),
    route("/admin/consumers/{group}/dead-letters/redrive", redrive_route, methods=["POST"]),
    route("/admin/producers", producers_route, methods=["GET"]),
    route("/admin/producers/{name}", producer_route, methods=["GET", "PUT", "DELETE"]),
    route("/admin/keys", keys_route, methods=["GET", "POST"]),
    route("/admin/keys/{key_id}", key_route, methods=["GET", "DELETE"]),
    route("/admin/backlog", backlog_route, methods=["GET"]),
    route("/admin/alerts", alerts_route, methods=["GET"]),
    route("/admin/alerts/evaluate", alerts_route, methods=["POST"]),
]
