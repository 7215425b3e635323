"""The Confluent REST Proxy v2 API (docs/rest-v2.md): produce, topic metadata and consumer
instances, served statelessly by every node.

Each route maps onto the gateway's own services: produce is ``/produce``'s path (the produce
gate, then core/produce.py); topic metadata is the topic admin's (``/admin/topics``);
consumer instances are core/instances.py over the consume path. Errors leave in the v2 shape
(``error_code``, ``message``): :func:`v2` turns the gateway's own answer into it, so the
status of every error is still decided in one place (api/errors.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..broker import OutgoingMessage
from ..core.errors import Conflict, invalid, unknown
from ..core.fetch import FetchStatus
from ..core.instances import Committed
from ..core.names import check_name, check_topic
from ..core.produce import produce
from ..ops import metrics
from . import v2_wire as wire
from .access import route
from .errors import ApiError, answer
from .http import NO_PARAMS, api_credential, check_query, object_body, query_number, read_json, services
from .numbers import query_int
from .routes import client_address, key_first, trace_answer, traced_produce

Handler = Callable[[Request], Awaitable[Response]]
_PRODUCE_PARAMS = frozenset({"producer"})
_RECORDS_PARAMS = frozenset({"timeout", "max_bytes"})


def v2(handler: Handler) -> Handler:
    """A v2 route: authenticated first (``key_first``), errors in the v2 shape."""
    keyed = key_first(handler)

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await keyed(request)
        except Exception as exc:  # noqa: BLE001 - every error is answered, in the v2 shape
            return wire.error_response(await answer(request, exc), exc)
    return wrapped


#: Paths only the v2 API has: a 404 or 405 there (answered by the router, before any route)
#: comes in the v2 shape too, as every other answer under them.
_V2_PATH = re.compile(r"/(topics|brokers)(/.*)?|/consumers/[^/]+(/instances(/.*)?)?/?")


async def http_error(request: Request, exc: Exception) -> Response:
    """The router's 404 and 405 (``HTTPException``): in the v2 shape under a v2 path."""
    native = await answer(request, exc)
    return wire.error_response(native, exc) if _V2_PATH.fullmatch(request.url.path) else native


def _no_content() -> Response:
    return Response(status_code=204)


# -- produce -----------------------------------------------------------------------------------
async def produce_route(request: Request) -> Response:
    """POST /topics/{topic} (and .../partitions/{partition})."""
    gw = services(request)
    credential = api_credential(request)
    check_query(request, _PRODUCE_PARAMS)
    fmt = wire.produce_format(request.headers.get("content-type"), gw.schemas is not None)
    topic = check_topic(request.path_params["topic"])
    raw_partition = request.path_params.get("partition")
    queue = wire.partition_param(raw_partition) if raw_partition is not None else None
    producer = check_name(request.query_params.get("producer"), "producer", required=False)
    body = await read_json(request, gw.settings.max_body_bytes, required=True)
    kind = fmt.kind
    ids: tuple[int | None, int | None] = (None, None)
    if kind is None:
        messages = wire.parse_produce(body, fmt, queue, gw.settings.max_produce_batch)
        await gw.produce_gate.check(credential, producer, topic)
    else:  # the schemas registered (or looked up) only once the caller may produce here
        assert gw.schemas is not None  # (produce_format refuses these formats without one)
        key_spec, value_spec, raw = wire.parse_schema_produce(body, queue,
                                                              gw.settings.max_produce_batch)
        await gw.produce_gate.check(credential, producer, topic)
        enc = await gw.schemas.encode(topic, kind, key_spec, value_spec, [r.key for r in raw],
                                      [r.value for r in raw])
        ids = (enc.key_id, enc.value_id)
        messages = [OutgoingMessage(v, k, queue=r.queue)
                    for r, k, v in zip(raw, enc.keys, enc.values, strict=True)]
    result = await traced_produce(request, topic, messages,
                                  lambda ms: produce(gw.broker, topic, ms))
    metrics.produced(len(result.results) - result.failed, result.failed)
    return wire.V2JSON(wire.produced_body(result, *ids))


# -- topics ------------------------------------------------------------------------------------
async def topics_route(request: Request) -> Response:
    """GET /topics: the names of the topics (not the gateway's nor the broker's own)."""
    gw = services(request)
    check_query(request, NO_PARAMS)
    await gw.auth.caller(api_credential(request))
    return wire.V2JSON([t.name for t in await gw.topics.list()])


async def brokers_route(request: Request) -> Response:
    """GET /brokers: the broker nodes' ids (Confluent's clients call it to check the proxy)."""
    gw = services(request)
    check_query(request, NO_PARAMS)
    await gw.auth.caller(api_credential(request))
    return wire.V2JSON({"brokers": await gw.broker.broker_ids()})


async def topic_route(request: Request) -> Response:
    gw = services(request)
    check_query(request, NO_PARAMS)
    await gw.auth.caller(api_credential(request))
    t = await gw.topics.describe(request.path_params["topic"])
    if "partition" in request.path_params:
        q = wire.find_partition(t, wire.partition_param(request.path_params["partition"]))
        if request.url.path.endswith("/offsets"):
            return wire.V2JSON(wire.offsets_body(q))
        return wire.V2JSON(wire.partition_body(q))
    if request.url.path.endswith("/partitions"):
        return wire.V2JSON([wire.partition_body(q) for q in t.queues])
    return wire.V2JSON(wire.topic_body(t))


# -- consumer instances --------------------------------------------------------------------------
def _names(request: Request) -> tuple[str, str]:
    return request.path_params["group"], request.path_params["instance"]


async def create_route(request: Request) -> Response:
    """POST /consumers/{group}: a new instance, served by every node."""
    gw = services(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    wire.check_request_type(request.headers.get("content-type"))
    args = wire.create_request(await object_body(request, required=False))
    inst = await gw.instances.create(credential, request.path_params["group"], **args)
    return wire.V2JSON(wire.created_body(inst, str(request.base_url)))


async def instance_route(request: Request) -> Response:
    """DELETE .../instances/{instance}: commit (auto-commit) or hand back its batches."""
    gw = services(request)
    check_query(request, NO_PARAMS)
    await gw.instances.delete(api_credential(request), *_names(request))
    return _no_content()


async def subscription_route(request: Request) -> Response:
    gw = services(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    group, name = _names(request)
    if request.method == "GET":
        inst = await gw.instances.get(credential, group, name)
        return wire.V2JSON({"topics": list(inst.topics)})
    if request.method == "DELETE":
        await gw.instances.subscribe(credential, group, name, [])
        return _no_content()
    wire.check_request_type(request.headers.get("content-type"))
    topics = wire.topics_request(await object_body(request))
    await gw.instances.subscribe(credential, group, name, topics)
    return _no_content()


async def records_route(request: Request) -> Response:
    """GET .../records: one fetch over the subscription (with auto-commit, the last one's
    batch is committed first)."""
    if request.method == "HEAD":  # starlette adds HEAD to GET routes; this GET locks and fetches
        raise HTTPException(405, "HEAD would lock a queue and throw the batch away; use GET",
                            headers={"Allow": "GET"})
    gw = services(request)
    check_query(request, _RECORDS_PARAMS)
    fmt = wire.records_format(request.headers.get("accept"))
    timeout = query_number(request, "timeout", -1, -1, 2**31 - 1)
    raw_max = request.query_params.get("max_bytes")
    max_bytes = query_int(raw_max.lstrip("-")) if raw_max is not None else 0
    if max_bytes is None:
        raise invalid("invalid_max_bytes", "max_bytes must be an integer")
    if raw_max is not None and raw_max.startswith("-"):
        max_bytes = 0  # as kafka-rest: 0 or less is no limit
    inst, got, decoded = await gw.instances.records(
        api_credential(request), *_names(request), fmt,
        None if timeout is None or timeout < 0 else timeout, max_bytes, client_address(request))
    metrics.fetched(got.status.value, got.count, bool(got.batch and got.batch.redelivered))
    if got.status is FetchStatus.RATE_LIMITED:  # as /message: a 429 to back off on
        retry_s = str(max(1, -(-got.retry_after_ms // 1000)))
        raise ApiError(429, "rate_limited", f"over consumer {inst.consumer!r}'s rate limit; "
                       f"retry in {got.retry_after_ms} ms", headers={"Retry-After": retry_s})
    return Response(wire.records_body(got, inst.format, decoded),
                    media_type=wire.records_type(inst.format),
                    headers=trace_answer(request, got.batch.records if got.batch else ()))


async def offsets_route(request: Request) -> Response:
    """POST .../offsets: commit (no body: every batch fetched); GET: the committed offsets of
    the partitions the body names."""
    gw = services(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    group, name = _names(request)
    body = await object_body(request, required=False)
    if request.method == "GET":
        asked = wire.offsets_request(body, "partitions")
        if asked is None:
            raise unknown("unknown_partition", "name the partitions: {\"partitions\": "
                          "[{\"topic\", \"partition\"}]}")
        rows = await gw.instances.committed(credential, group, name,
                                            [(t, q) for t, q, _ in asked])
        return wire.V2JSON(wire.committed_body(rows))
    done: Committed = await gw.instances.commit(credential, group, name,
                                                wire.offsets_request(body, "offsets"))
    if done.lost:
        lost = ", ".join(f"{r.topic}/{r.queue} from offset {r.offset}" for r in done.lost)
        raise Conflict("commit_failed", f"not committed, their locks ran out and the "
                            f"records went (or will go) to another fetch: {lost}")
    return Response(status_code=200)  # as the Confluent proxy: no body


async def positions_route(request: Request) -> Response:
    """POST .../positions (offsets), .../positions/beginning and .../positions/end: a seek, which
    here moves the consumer's committed offsets of those partitions (core/instances.py)."""
    gw = services(request)
    check_query(request, NO_PARAMS)
    wire.check_request_type(request.headers.get("content-type"))
    body = await object_body(request)
    path = request.url.path
    to = "earliest" if path.endswith("/beginning") else "latest" if path.endswith("/end") \
        else "offset"
    targets = wire.offsets_request(body, "offsets" if to == "offset" else "partitions")
    if not targets:
        raise invalid("invalid_offsets" if to == "offset" else "invalid_partitions",
                      "name at least one partition")
    await gw.instances.seek(api_credential(request), *_names(request), to, targets)
    return _no_content()


async def assignments_route(request: Request) -> Response:
    """Assignments: a Kafka consumer's own, which an instance here has not."""
    gw = services(request)
    await gw.instances.get(api_credential(request), *_names(request))  # 404 for an unknown one
    raise Conflict("assignments_unsupported", "instances of this gateway have no partition "
                   "assignment: any instance of a group takes whichever queue is free. "
                   "Subscribe to the topics instead")


async def topic_or_produce(request: Request) -> Response:
    """``/topics/{topic}`` and ``.../partitions/{p}``: GET describes, POST produces (one route
    per path, so that a 405's ``Allow`` lists both)."""
    return await (produce_route if request.method == "POST" else topic_route)(request)


_I = "/consumers/{group}/instances/{instance}"

v2_routes = [
    route("/brokers", v2(brokers_route), methods=["GET"]),
    route("/topics", v2(topics_route), methods=["GET"]),
    route("/topics/{topic}", v2(topic_or_produce), methods=["GET", "POST"]),
    route("/topics/{topic}/partitions", v2(topic_route), methods=["GET"]),
    route("/topics/{topic}/partitions/{partition}", v2(topic_or_produce), methods=["GET", "POST"]),
    route("/topics/{topic}/partitions/{partition}/offsets", v2(topic_route), methods=["GET"]),
    route("/consumers/{group}", v2(create_route), methods=["POST"]),
    route(_I, v2(instance_route), methods=["DELETE"]),
    route(_I + "/subscription", v2(subscription_route), methods=["GET", "POST", "DELETE"]),
    route(_I + "/records", v2(records_route), methods=["GET"]),
    route(_I + "/offsets", v2(offsets_route), methods=["GET", "POST"]),
    route(_I + "/positions", v2(positions_route), methods=["POST"]),
    route(_I + "/positions/", v2(positions_route), methods=["POST"]),  # pymapr-kafkarest's
    route(_I + "/positions/beginning", v2(positions_route), methods=["POST"]),
    route(_I + "/positions/end", v2(positions_route), methods=["POST"]),
    route(_I + "/assignments", v2(assignments_route), methods=["GET", "POST"]),
]
