"""Admin API routes (``/admin/...``): registry, keys, pause/resume, resets, backlog and alerts.

Every route here requires an admin key when auth is on. Each change is a Redis write that
the next request on every node reads, so there is no reload window.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..core import reset as reset_offsets
from ..core.errors import invalid, unknown
from ..core.names import check_name, check_public_topic
from ..ops import backlog
from ..store import now_ms
from .access import route
from .admin_wire import (
    ALERTS_PARAMS,
    BACKLOG_PARAMS,
    DEAD_PARAMS,
    DELETE_OFFSETS,
    DELETE_PARAMS,
    REDRIVE_FIELDS,
    backlog_body,
    dead_page_body,
    key_body,
    key_request,
    paused_body,
    redrive_request,
    redriven_body,
    reset_body,
    reset_request,
)
from .http import (
    JSON,
    NO_PARAMS,
    admin_services,
    check_query,
    flag,
    object_body,
    query_number,
    queue_param,
)
from .produce_wire import MAX_PARTITION
from .registry_wire import (
    consumer_body,
    consumer_fields,
    delete_body,
    producer_body,
    producer_topics,
    registration_fields,
)


# -- consumers -------------------------------------------------------------------------------
async def consumers_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    return JSON({"consumers": [consumer_body(r, gw.settings) for r in await gw.registry.list_consumers()]})


async def consumer_route(request: Request) -> Response:
    gw = await admin_services(request)
    consumer = check_name(request.path_params["consumer"], "consumer",
                          internal_ok=request.method == "GET")
    if request.method == "GET":
        return JSON(consumer_body(await gw.registry.get_consumer(consumer), gw.settings))
    if request.method == "DELETE":
        check_query(request, DELETE_PARAMS)
        return JSON(delete_body(await gw.registry.delete_consumer(consumer, flag(request, DELETE_OFFSETS))))
    check_query(request, NO_PARAMS)
    body = await object_body(request)
    if request.method == "PUT":
        rec, created = await gw.registry.put_consumer(consumer, registration_fields(body))
        return JSON(consumer_body(rec, gw.settings), status_code=201 if created else 200)
    rec = await gw.registry.patch_consumer(consumer, consumer_fields(body))
    return JSON(consumer_body(rec, gw.settings))


async def pause_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    consumer = check_name(request.path_params["consumer"], "consumer")
    paused = request.url.path.endswith("/pause")
    created = await gw.registry.set_paused(consumer, paused)
    return JSON(paused_body(consumer, paused, created))


async def reset_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    consumer = check_name(request.path_params["consumer"], "consumer")
    body = await object_body(request)
    cfg, created = await gw.registry.writable(consumer)  # 404 for an unknown name comes first
    req = reset_request(body)
    check_public_topic(req.topic, gw.internal)
    result = await reset_offsets.reset(gw.store, gw.broker, consumer, req, cfg,
                                       gw.settings.client_idle_ms, gw.checkpoints)
    return JSON({**reset_body(result),
                 **({"created": True} if created and not result.dry_run else {})})


# -- dead letters ----------------------------------------------------------------------------
async def dead_letters_route(request: Request) -> Response:
    """GET: count, age and a page of the consumer's dead letters not yet redriven."""
    gw = await admin_services(request)
    consumer = check_name(request.path_params["consumer"], "consumer")
    check_query(request, DEAD_PARAMS)
    await gw.registry.require_seen(consumer)
    encoding = request.query_params.get("encoding", "utf8")
    if encoding not in ("utf8", "base64"):
        raise invalid("invalid_encoding", "encoding must be 'utf8' or 'base64'")
    partition = query_number(request, "partition", None, 0, MAX_PARTITION)
    limit = query_number(request, "limit", 20, 0, 1000)
    assert limit is not None  # it has a default
    page = await gw.dead_letters.page(
        consumer, limit, queue_param(request.query_params.get("queue"),
                                     str(partition) if partition is not None else None),
        query_number(request, "offset", None, 0, 2**63 - 1))
    return JSON(dead_page_body(page, encoding))


async def redrive_route(request: Request) -> Response:
    """POST: send the oldest dead letters not yet redriven back, all or a range."""
    gw = await admin_services(request)
    consumer = check_name(request.path_params["consumer"], "consumer")
    body = await object_body(request, required=False)
    check_query(request, REDRIVE_FIELDS, body=body)
    await gw.registry.require_known(consumer)
    await gw.registry.require_seen(consumer)  # in open mode too: a never-seen name has none
    target, partition, to_offset, limit = redrive_request(body)
    moved = await gw.dead_letters.redrive(consumer, target, partition, to_offset, limit)
    return JSON(redriven_body(consumer, await gw.dead_letters.topic_of(consumer), target, moved))


# -- producers -------------------------------------------------------------------------------
async def producers_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    return JSON({"producers": [producer_body(r) for r in await gw.registry.list_producers()]})


async def producer_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    name = check_name(request.path_params["name"], "producer")
    if request.method == "GET":
        rec = await gw.registry.get_producer(name)
        assert rec is not None  # not missing_ok: an unknown producer raised
        return JSON(producer_body(rec))
    if request.method == "DELETE":
        await gw.registry.delete_producer(name)
        return JSON({"producer": name, "unregistered": True})
    rec, created = await gw.registry.put_producer(name, producer_topics(await object_body(request)))
    return JSON(producer_body(rec), status_code=201 if created else 200)


# -- API keys --------------------------------------------------------------------------------
async def keys_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    if request.method == "GET":
        return JSON({"keys": [key_body(r) for r in await gw.keys.all()]})
    name, is_admin, producers, consumers = key_request(await object_body(request))
    key, rec = await gw.keys.create(name, admin=is_admin, producers=producers, consumers=consumers)
    return JSON({**key_body(rec), "key": key}, status_code=201)


async def key_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    key_id = request.path_params["key_id"]
    rec = await (gw.keys.revoke(key_id) if request.method == "DELETE" else gw.keys.get(key_id))
    if rec is None:
        raise unknown("unknown_key", f"no API key with id {key_id!r}")
    return JSON({**key_body(rec), "revoked": True} if request.method == "DELETE" else key_body(rec))


# -- backlog and alerts ----------------------------------------------------------------------
async def backlog_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, BACKLOG_PARAMS, lists=frozenset({"consumer"}))
    names = [check_name(c, "consumer", internal_ok=True) for c in request.query_params.getlist("consumer")]
    for name in names:  # a typo is told, not shown as an empty row
        await gw.registry.require_seen(name)
    rows, stale = await backlog.view(gw, names or None, with_age=flag(request, "age", default=True))
    return JSON(backlog_body(rows, now_ms(), stale))


async def alerts_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, ALERTS_PARAMS)
    include_all = flag(request, "all")
    if request.method == "POST":  # /admin/alerts/evaluate
        await gw.alerts.evaluate_now()
    return JSON(await gw.alerts.view(include_all=include_all))


admin_routes = [
    route("/admin/consumers", consumers_route, methods=["GET"]),
    route("/admin/consumers/{consumer}", consumer_route, methods=["GET", "PUT", "PATCH", "DELETE"]),
    route("/admin/consumers/{consumer}/pause", pause_route, methods=["POST"]),
    route("/admin/consumers/{consumer}/resume", pause_route, methods=["POST"]),
    route("/admin/consumers/{consumer}/reset", reset_route, methods=["POST"]),
    route("/admin/consumers/{consumer}/dead-letters", dead_letters_route, methods=["GET"]),
    route("/admin/consumers/{consumer}/dead-letters/redrive", redrive_route, methods=["POST"]),
    route("/admin/producers", producers_route, methods=["GET"]),
    route("/admin/producers/{name}", producer_route, methods=["GET", "PUT", "DELETE"]),
    route("/admin/keys", keys_route, methods=["GET", "POST"]),
    route("/admin/keys/{key_id}", key_route, methods=["GET", "DELETE"]),
    route("/admin/backlog", backlog_route, methods=["GET"]),
    route("/admin/alerts", alerts_route, methods=["GET"]),
    route("/admin/alerts/evaluate", alerts_route, methods=["POST"]),
]
