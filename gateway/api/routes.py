"""HTTP routes of the data API. Handlers only parse, call a service, and shape the response."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..broker import OutgoingMessage, Record, UnknownTopic
from ..core import trace
from ..core.errors import Busy, DomainError, Forbidden, Unauthenticated, unknown
from ..core.fetch import FetchStatus
from ..core.names import check_name
from ..core.produce import produce, within_produce_timeout
from ..core.schemas import KINDS, no_registry
from ..core.views import queue_rows
from ..ops import metrics
from ..store import AckResult, now_ms
from .access import route
from .consume_wire import (
    ACK_PARAMS,
    BATCH_PARAMS,
    FETCH_PARAMS,
    NACK_PARAMS,
    ack_body,
    clients_body,
    extend_body,
    failed_body,
    fetch_request,
    fetched_body,
    nack_request,
    queues_body,
    request_id,
    unlock_body,
    with_ack_error,
)
from .errors import ACK_STATUS, EXTEND_STATUS, UNLOCK_STATUS, ApiError
from .http import JSON, NO_PARAMS, api_credential, check_query, params, read_json, services
from .produce_wire import cancelled_body, parse_produce, produced_body

_SPEC = resources.files("gateway") / "openapi.yaml"  # a link to the top-level spec, packaged as data

Handler = Callable[[Request], Awaitable[Response]]
T = TypeVar("T")


def key_first(handler: Handler) -> Handler:
    """Authenticate first, on every route that takes a key: a caller with a missing, malformed,
    unknown or revoked key gets its ``401``, whatever else is wrong with the request.

    The hot paths verify a well-formed key inside the script that serves the request (no round
    trip of its own), after the input was read; a refusal before that (bad input, an unknown
    topic or consumer, a body too large) would answer a ``400`` or ``404`` to a caller that
    never had a valid key. So every refusal is given only once the key was verified (one Redis
    read, on refusals only): the answer is the one checking the key first would have given, and
    requests that succeed pay nothing."""
    @functools.wraps(handler)
    async def keyed(request: Request) -> Response:
        try:
            return await handler(request)
        except (DomainError, ApiError, UnknownTopic) as e:
            if isinstance(e, (Unauthenticated, Busy)) or (isinstance(e, ApiError) and e.status >= 500):
                raise
            await services(request).auth.caller(api_credential(request))  # 401 wins
            raise
    return keyed


def trace_context(request: Request) -> list[tuple[str, bytes]]:
    """The record headers of a produce request's W3C trace context (core/trace.py)."""
    h = request.headers
    return trace.context_headers(h.get(trace.TRACEPARENT), h.get(trace.TRACESTATE))


async def traced_produce(request: Request, topic: str, messages: list[OutgoingMessage],
                         send: Callable[[list[OutgoingMessage]], Awaitable[T]]) -> T:
    """``send(messages)`` for a produce request (native or REST v2): inside its producer span,
    the records carrying the span's trace context (or the request's when spans are off), the
    whole bounded by ``produce_timeout_ms`` (core/produce.py)."""
    gw = services(request)
    context = trace_context(request)
    with gw.spans.span(f"{topic} publish", "producer", context, {
            "messaging.destination.name": topic,
            "messaging.batch.message_count": len(messages)}) as span:
        stamped = trace.stamp(messages, span.headers() or context)
        return await within_produce_timeout(send(stamped), gw.settings.produce_timeout_ms)


def trace_answer(request: Request, records: Sequence[Record]) -> dict[str, str] | None:
    """A fetch's answer headers: the batch's first trace context, when the client asked
    (``Prefer: trace-context``)."""
    if not trace.prefers_context(request.headers.get("prefer")):
        return None
    return {**trace.first_context(records), "Preference-Applied": trace.PREFER}


def client_address(request: Request) -> str:
    fwd = request.headers.get("x-forwarded-for")
    if fwd:
        return fwd.split(",")[0].strip()
    c = request.client
    return f"{c.host}:{c.port}" if c else ""


async def produce_route(request: Request) -> Response:
    gw = services(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    body = await read_json(request, gw.settings.max_body_bytes, required=True)
    topic, producer, messages, dues, schemas = parse_produce(body, gw.settings.max_produce_batch,
                                                             now_ms())
    if schemas is not None and gw.schemas is None:
        raise no_registry(schemas.kind)
    await gw.produce_gate.check(credential, producer, topic)
    ids = None
    if schemas is not None:  # registered or looked up only once the caller may produce here
        assert gw.schemas is not None
        enc = await gw.schemas.encode(topic, schemas.kind, schemas.key, schemas.value,
                                      schemas.keys, schemas.values)
        ids = (enc.key_id, enc.value_id)
        messages = [replace(m, key=k, value=v)
                    for m, k, v in zip(messages, enc.keys, enc.values, strict=True)]
    if dues is None:
        result = await traced_produce(request, topic, messages,
                                      lambda ms: produce(gw.broker, topic, ms))
        delayed = None
    else:
        result, delayed = await traced_produce(request, topic, messages,
                                               lambda ms: gw.delay.produce(topic, ms, dues))
    metrics.produced(len(result.results) - result.failed, result.failed)
    return JSON(produced_body(result, delayed, ids))


async def cancel_delayed_route(request: Request) -> Response:
    """DELETE /delayed/{delayId}: the caller must be allowed to produce to the record's topic
    (as ``producer``, a query parameter, when the registry asks for one), or hold an admin key:
    cancelling a record is an operator's action too (the console's Delayed view). The admin
    check runs only after the producer check refused, so a producer's cancel costs no more."""
    gw = services(request)
    credential = api_credential(request)
    check_query(request, frozenset({"producer"}))
    delay_id = request.path_params["delay_id"]
    ref = gw.delay.ids.parse(delay_id)
    producer = check_name(request.query_params.get("producer"), "producer", required=False)
    try:
        await gw.produce_gate.check(credential, producer, ref.topic)
    except Forbidden:
        if not await gw.auth.is_admin(credential):
            raise
    return JSON(cancelled_body(await gw.delay.cancel(delay_id)))


async def message_route(request: Request) -> Response:
    if request.method == "HEAD":  # starlette adds HEAD to GET routes; this GET locks and fetches
        raise HTTPException(405, "HEAD would lock a queue and throw the batch away; use GET",
                            headers={"Allow": "GET, POST"})
    gw = services(request)
    credential = api_credential(request)
    fetch, encoding = fetch_request(await params(request, FETCH_PARAMS), gw.settings,
                                    client_address(request), credential, gw.internal)
    kind = KINDS.get(encoding)
    if kind is not None and gw.schemas is None:
        raise no_registry(kind)
    with gw.spans.span(f"{fetch.topic} receive", "consumer", trace_context(request), {
            "messaging.destination.name": fetch.topic,
            "messaging.consumer.group.name": fetch.consumer}) as span:
        f = await gw.consume.fetch(fetch)  # a piggy-backed ack: counted by ConsumeService.on_ack
        if f.batch is not None:
            span.link(f.batch.records)
            span.set("messaging.batch.message_count", len(f.batch.records))
    decoded = None
    if kind is not None and f.batch is not None:
        assert gw.schemas is not None
        decoded = await gw.schemas.decode_all(kind, [(r.key, r.value) for r in f.batch.records])
    body = fetched_body(f, gw.broker.name, encoding, fetch.topics, decoded)
    metrics.fetched(f.status.value, f.count, bool(body.get("redelivered")))
    if f.status is FetchStatus.RATE_LIMITED:
        retry_s = str(max(1, -(-f.retry_after_ms // 1000)))
        return JSON(body, status_code=429, headers={"Retry-After": retry_s})
    return JSON(body, headers=trace_answer(request, f.batch.records if f.batch else ()))


def _ack_response(r: AckResult, body: dict[str, Any]) -> Response:
    return JSON(with_ack_error(r, body), status_code=ACK_STATUS[r.result])


async def ack_route(request: Request) -> Response:
    """POST /ack; with ``failed`` (offsets of the batch that failed) it is a partial nack."""
    gw = services(request)
    credential = api_credential(request)
    p = await params(request, ACK_PARAMS, BATCH_PARAMS)
    failed, _ = nack_request(p)
    if failed:
        f = await gw.nack.fail(request_id(p), failed, credential)  # the commit is counted by on_ack
        metrics.failed(len(f.retried), len(f.dead))
        return _ack_response(f.ack, failed_body(f))
    with gw.spans.span("mqgw ack", "client", trace_context(request)) as span:
        r = await gw.consume.ack(request_id(p), credential)  # counted by on_ack
        span.set("mqgw.ack.result", r.result.value)
    return _ack_response(r, ack_body(r))


async def nack_route(request: Request) -> Response:
    """POST /nack: the batch (or its ``failed`` offsets) failed; retried after ``delayMs`` or
    the consumer's retry policy, then dead-lettered; the batch is committed."""
    gw = services(request)
    credential = api_credential(request)
    p = await params(request, NACK_PARAMS, BATCH_PARAMS)
    failed, delay = nack_request(p)
    f = await gw.nack.fail(request_id(p), failed, credential, delay)
    metrics.failed(len(f.retried), len(f.dead))
    return _ack_response(f.ack, failed_body(f))


async def extend_route(request: Request) -> Response:
    """POST /extend: hold the batch's queue for another lock timeout, from now."""
    gw = services(request)
    credential = api_credential(request)
    r = await gw.consume.extend(request_id(await params(request, BATCH_PARAMS)), credential)
    return JSON(extend_body(r), status_code=EXTEND_STATUS[r.result])


async def unlock_route(request: Request) -> Response:
    gw = services(request)
    credential = api_credential(request)
    r = await gw.consume.unlock(request_id(await params(request, BATCH_PARAMS)), credential)
    return JSON(unlock_body(r), status_code=UNLOCK_STATUS[r.result])


async def queues_route(request: Request) -> Response:
    gw = services(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    consumer = check_name(request.path_params["consumer"], "consumer", internal_ok=True)
    client_id = check_name(request.path_params.get("client_id"), "clientId", required=False)
    await gw.auth.require_consumer(credential, consumer)
    cfg = await gw.registry.require_seen(consumer, client_id)  # a typo is a 404, not an empty list
    timeout = int(cfg.get("consume_timeout_ms") or gw.settings.consume_timeout_ms)
    return JSON(queues_body(consumer, client_id, timeout,
                            await queue_rows(gw.store, consumer, client_id)))


async def clients_route(request: Request) -> Response:
    gw = services(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    consumer = check_name(request.path_params["consumer"], "consumer", internal_ok=True)
    await gw.auth.require_consumer(credential, consumer)
    await gw.registry.require_seen(consumer)
    return JSON(clients_body(consumer, gw.settings.client_idle_ms, await gw.store.clients(consumer),
                             now_ms()))


async def metrics_route(request: Request) -> Response:
    """``GET /metrics`` in the Prometheus text format."""
    return Response(await metrics.render(), headers={"content-type": metrics.CONTENT_TYPE_LATEST})


async def healthz(request: Request) -> Response:
    return JSON({"status": "ok"})


#: How long each readiness check may take (both run at once): a check that has not answered
#: by then has failed, whatever it waits for.
READY_CHECK_S = 2.5


async def _check(what: Awaitable[Any]) -> str | None:
    """None if ``what`` ended within :data:`READY_CHECK_S`, else what went wrong."""
    try:
        await asyncio.wait_for(what, READY_CHECK_S)
    except TimeoutError:
        return f"no answer within {READY_CHECK_S} s"
    except Exception as e:  # noqa: BLE001 - any failure means not ready; the text says which
        return str(e) or type(e).__name__
    return None


async def readyz(request: Request) -> Response:
    """Redis and the broker checked at once, each within :data:`READY_CHECK_S`, and the answer
    says what failed (``reasons``)."""
    gw = services(request)
    redis_problem, broker_problem = await asyncio.gather(_check(gw.store.ping()),
                                                         _check(gw.broker.ping()))
    reasons = {k: v for k, v in (("redis", redis_problem), ("broker", broker_problem)) if v}
    body: dict[str, Any] = {"status": "unavailable" if reasons else "ok",
                            "checks": {"redis": redis_problem is None, "broker": broker_problem is None}}
    if reasons:
        body["reasons"] = reasons
    return JSON(body, status_code=503 if reasons else 200)


@functools.cache
def _spec() -> bytes:
    return _SPEC.read_bytes() if _SPEC.is_file() else b""


async def openapi_route(request: Request) -> Response:
    spec = _spec()
    if not spec:
        raise unknown("not_found", "openapi.yaml is not installed with this gateway")
    return Response(spec, media_type="application/yaml")


data_routes = [
    route("/metrics", metrics_route, methods=["GET"]),
    route("/produce", key_first(produce_route), methods=["POST"]),
    route("/delayed/{delay_id}", key_first(cancel_delayed_route), methods=["DELETE"]),
    route("/message", key_first(message_route), methods=["GET", "POST"]),
    route("/ack", key_first(ack_route), methods=["POST"]),
    route("/nack", key_first(nack_route), methods=["POST"]),
    route("/extend", key_first(extend_route), methods=["POST"]),
    route("/unlock", key_first(unlock_route), methods=["POST"]),
    # Matched in order, one regex each: the hot paths first, then the probes.
    route("/healthz", healthz, methods=["GET"]),
    route("/readyz", readyz, methods=["GET"]),
    route("/consumers/{consumer}/queues", key_first(queues_route), methods=["GET"]),
    route("/consumers/{consumer}/clients", key_first(clients_route), methods=["GET"]),
    route("/consumers/{consumer}/clients/{client_id}/queues", key_first(queues_route), methods=["GET"]),
    route("/openapi.yaml", openapi_route, methods=["GET"]),
]
