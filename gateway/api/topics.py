"""Admin API routes for topics (``/admin/topics``): list, describe and create.

Admin-key protected like every ``/admin`` route. The JSON shapes are ``admin_wire``'s; what
exists, whose it is and what may be created is :mod:`gateway.core.topics`'.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from .access import route
from .admin_wire import TOPIC_LIST_PARAMS, topic_body, topic_request
from .http import JSON, NO_PARAMS, admin_services, check_query, flag, object_body


async def topics_route(request: Request) -> Response:
    """GET: the topics (``internal=true``: also the gateway's and the broker's own); POST:
    create one."""
    gw = await admin_services(request)
    if request.method == "GET":
        check_query(request, TOPIC_LIST_PARAMS)
        listed = await gw.topics.list(include_internal=flag(request, "internal"))
        return JSON({"topics": [topic_body(t) for t in listed]})
    check_query(request, NO_PARAMS)
    name, partitions, replication = topic_request(await object_body(request))
    created = await gw.topics.create(name, partitions, replication)
    return JSON(topic_body(created), status_code=201)


async def topic_route(request: Request) -> Response:
    gw = await admin_services(request)
    check_query(request, NO_PARAMS)
    return JSON(topic_body(await gw.topics.describe(request.path_params["topic"])))


topic_routes = [
    route("/admin/topics", topics_route, methods=["GET", "POST"]),
    route("/admin/topics/{topic}", topic_route, methods=["GET"]),
]
