"""Admin API routes for topics (``/admin/topics``): list, describe and create.

Admin-key protected like every ``/admin`` route. The JSON shapes are this module's; what
exists, whose it is and what may be created is :mod:`gateway.core.topics`'.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import bad_request
from ..core.topics import Topic
from .access import route
from .admin import _admin, _flag, _object_body
from .numbers import json_int
from .routes import JSON, NO_PARAMS, check_query

_LIST_PARAMS = frozenset({"internal"})
_CREATE_FIELDS = frozenset({"name", "partitions", "replicationFactor"})


def topic_body(t: Topic) -> dict[str, Any]:
    """A topic with its partitions: replicas and watermarks (``null`` where the broker could not
    tell: no leader, or a partition whose offsets did not answer)."""
    return {
        "name": t.name,
        "internal": t.internal,
        "partitionCount": len(t.queues),
        "replicationFactor": t.replication,
        "partitions": [{
            "partition": int(q.queue) if q.queue.isdigit() else q.queue,
            "leader": q.leader if q.leader >= 0 else None,
            "replicas": list(q.replicas),
            "inSync": list(q.in_sync),
            "earliestOffset": q.low if q.low >= 0 else None,
            "endOffset": q.high if q.high >= 0 else None,
        } for q in t.queues],
    }


async def topics_route(request: Request) -> Response:
    """GET: the topics (``internal=true``: also the gateway's and the broker's own); POST:
    create one."""
    gw = await _admin(request)
    if request.method == "GET":
        check_query(request, _LIST_PARAMS)
        listed = await gw.topics.list(include_internal=_flag(request, "internal"))
        return JSON({"topics": [topic_body(t) for t in listed]})
    check_query(request, NO_PARAMS)
    body = await _object_body(request, gw)
    unknown = set(body) - _CREATE_FIELDS
    if unknown:
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(unknown))} "
                          f"(a topic takes {', '.join(sorted(_CREATE_FIELDS))})")
    if body.get("partitions") is None:
        raise bad_request("missing_partitions", "partitions is required")
    partitions = json_int(body["partitions"])
    if partitions is None:
        raise bad_request("invalid_partitions", "partitions must be an integer")
    replication: int | None = None
    if body.get("replicationFactor") is not None:
        replication = json_int(body["replicationFactor"])
        if replication is None:
            raise bad_request("invalid_replication_factor",
                              "replicationFactor must be an integer, or null for the broker's default")
    created = await gw.topics.create(body.get("name"), partitions, replication)
    return JSON(topic_body(created), status_code=201)


async def topic_route(request: Request) -> Response:
    gw = await _admin(request)
    check_query(request, NO_PARAMS)
    return JSON(topic_body(await gw.topics.describe(request.path_params["topic"])))


topic_routes = [
    route("/admin/topics", topics_route, methods=["GET", "POST"]),
    route("/admin/topics/{topic}", topic_route, methods=["GET"]),
]
