"""HTTP routes. Handlers only parse, call a service, and shape the response."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..broker import UnknownTopic
from ..core.auth import credential_of
from ..core.consume import FetchParams, FetchStatus
from ..core.errors import Busy, DomainError, Unauthenticated, bad_request, unauthorized
from ..core.names import check_name, check_public_topic, internal_topic_prefixes
from ..core.produce import produce
from ..core.views import queue_rows
from ..ops import metrics
from ..store import AckOutcome, AckResult, Credential, UnlockOutcome, now_ms
from .access import route
from .errors import ApiError
from .numbers import json_int, query_int
from .wire import (
    ack_body,
    cancelled_body,
    failed_body,
    fetched_body,
    parse_delay_ms,
    parse_failed,
    parse_produce,
    produced_body,
)


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _state(request: Request) -> Any:
    return request.app.state.gw


async def read_json(request: Request, limit: int, required: bool = False) -> Any:
    """Read a JSON body, refusing more than ``limit`` bytes before buffering it all. An empty
    body is ``{}``, or a 400 where the spec requires a body (``required``)."""
    declared = request.headers.get("content-length")
    if declared is not None and (n := query_int(declared)) is not None and n > limit:
        raise ApiError(413, "body_too_large", f"request body exceeds {limit} bytes", limit=limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"request body exceeds {limit} bytes", limit=limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        if required:
            raise bad_request("missing_body", "this request needs a JSON body")
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("invalid_json", "request body is not valid JSON") from None


#: The parameters of /message, and of /ack and /unlock: anything else is refused, since a typo
#: (``maxx=5``) would otherwise lock a queue with the default batch size.
FETCH_PARAMS = frozenset({"consumer", "topic", "clientId", "max", "wait_ms", "encoding", "requestId"})
BATCH_PARAMS = frozenset({"requestId"})
ACK_PARAMS = frozenset({"requestId", "failed"})
NACK_PARAMS = frozenset({"requestId", "failed", "delayMs"})
#: Operations that take no query parameters refuse any: a typo like ``?topci=`` or
#: ``?dry_run=true`` must not pass silently while the call does something else.
NO_PARAMS: frozenset[str] = frozenset()


def check_query(request: Request, known: frozenset[str], lists: frozenset[str] = frozenset(),
                body: Iterable[str] = ()) -> None:
    """Refuse a query string (and the ``body`` field names given with it) that names a parameter
    the operation does not take (``unknown_parameter``), or that repeats one that is not a list
    (``repeated_parameter``). A typo must not silently change what a call does
    (``deleteOffset=true`` would keep the offsets), and of ``max=1&max=1000`` a proxy or a cache
    in front may take another value than the gateway would."""
    names = Counter(k for k, _ in request.query_params.multi_items())
    unknown = sorted((names.keys() | set(body)) - known)
    if unknown:
        raise bad_request("unknown_parameter", f"unknown parameter(s): {', '.join(unknown)} "
                          f"(this endpoint takes {', '.join(sorted(known)) or 'none'})",
                          parameters=unknown)
    repeated = sorted(n for n, count in names.items() if count > 1 and n not in lists)
    if repeated:
        raise bad_request("repeated_parameter", f"parameter(s) given more than once: "
                          f"{', '.join(repeated)}", parameters=repeated)


@dataclass(frozen=True, slots=True)
class Params:
    """The parameters of /message, /ack and /unlock: the query string overlaid with a JSON body
    (POST). A body field wins, and ``null`` in a body is the same as leaving the field out."""

    query: Mapping[str, str]
    body: Mapping[str, Any]

    def get(self, name: str) -> Any:
        v = self.body.get(name)
        return self.query.get(name) if v is None else v

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        """An integer in [lo, hi], else ``400 invalid_<name>``. Read by where it came from
        (gateway/api/numbers.py): a JSON number in a body, ASCII digits in a query string."""
        v = self.body.get(name)
        if v is not None:
            n = json_int(v)
        elif name in self.query:
            n = query_int(self.query[name])
        else:
            return default
        if n is None:
            raise bad_request(f"invalid_{name}", f"{name} must be an integer", parameter=name)
        if not lo <= n <= hi:
            raise bad_request(f"invalid_{name}", f"{name} must be between {lo} and {hi}",
                              parameter=name, min=lo, max=hi)
        return n


async def _params(request: Request, known: frozenset[str],
                  query_known: frozenset[str] | None = None) -> Params:
    """Query parameters and, for POST, a JSON object body; names outside ``known`` are refused,
    and in the query string those outside ``query_known`` too (fields read from the body only:
    ``?delayMs=`` must not be ignored)."""
    body: Any = {}
    if request.method == "POST":
        body = await read_json(request, _state(request).settings.max_body_bytes)
        if not isinstance(body, dict):
            raise bad_request("invalid_body", "request body must be a JSON object")
    check_query(request, known, body=body)
    if query_known is not None:
        check_query(request, query_known)
    return Params(request.query_params, body)


def api_credential(request: Request) -> Credential | None:
    """The API key in ``Authorization: Bearer <key>`` (or ``X-API-Key``); None when auth is off.
    A missing or malformed key is a 401 (the key's format is the core's rule)."""
    if not _state(request).auth.enabled:
        return None
    raw = request.headers.get("authorization", "")
    if raw:
        scheme, _, raw = raw.partition(" ")
        if scheme.lower() != "bearer":
            raise unauthorized("invalid_api_key", "use 'Authorization: Bearer <key>'")
        raw = raw.strip()
    else:
        raw = request.headers.get("x-api-key", "").strip()
    return credential_of(raw)


Handler = Callable[[Request], Awaitable[Response]]


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
            await _state(request).auth.caller(api_credential(request))  # 401 wins
            raise
    return keyed


def client_address(request: Request) -> str:
    fwd = request.headers.get("x-forwarded-for")
    if fwd:
        return fwd.split(",")[0].strip()
    c = request.client
    return f"{c.host}:{c.port}" if c else ""


async def produce_route(request: Request) -> Response:
    gw = _state(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    body = await read_json(request, gw.settings.max_body_bytes, required=True)
    topic, producer, messages, dues = parse_produce(body, gw.settings.max_produce_batch, now_ms())
    await gw.produce_gate.check(credential, producer, topic)
    if dues is None:
        result = await produce(gw.broker, topic, messages)
        delayed = None
    else:
        result, delayed = await gw.delay.produce(topic, messages, dues)
    metrics.produced(len(result.results) - result.failed, result.failed)
    return JSON(produced_body(result, delayed))


async def cancel_delayed_route(request: Request) -> Response:
    """DELETE /delayed/{delayId}: the caller must be allowed to produce to the record's topic
    (as ``producer``, a query parameter, when the registry asks for one)."""
    gw = _state(request)
    credential = api_credential(request)
    check_query(request, frozenset({"producer"}))
    delay_id = request.path_params["delay_id"]
    ref = gw.delay.ids.parse(delay_id)
    producer = check_name(request.query_params.get("producer"), "producer", required=False)
    await gw.produce_gate.check(credential, producer, ref.topic)
    return JSON(cancelled_body(await gw.delay.cancel(delay_id)))


# -- statuses of the consume path ---------------------------------------------------------
_ACK_STATUS = {AckOutcome.COMMITTED: 200, AckOutcome.ALREADY_COMMITTED: 200,
               AckOutcome.LOCK_LOST: 409, AckOutcome.OFFSET_RESET: 409,
               AckOutcome.OFFSET_MISMATCH: 409, AckOutcome.UNKNOWN: 404}
_UNLOCK_STATUS = {UnlockOutcome.UNLOCKED: 200, UnlockOutcome.NOT_LOCKED: 200,
                  UnlockOutcome.LOCK_LOST: 409, UnlockOutcome.UNKNOWN: 404}

async def message_route(request: Request) -> Response:
    if request.method == "HEAD":  # starlette adds HEAD to GET routes; this GET locks and fetches
        raise HTTPException(405, "HEAD would lock a queue and throw the batch away; use GET",
                            headers={"Allow": "GET, POST"})
    gw = _state(request)
    s = gw.settings
    credential = api_credential(request)
    p = await _params(request, FETCH_PARAMS)
    encoding = p.get("encoding")
    if encoding is None:
        encoding = "utf8"
    elif encoding not in ("utf8", "base64"):  # ``encoding=`` too: an empty value is no default
        raise bad_request("invalid_encoding", "encoding must be 'utf8' or 'base64'")
    rid = p.get("requestId")  # absent or empty: no piggy-backed ack
    if rid is None:
        rid = ""
    if not isinstance(rid, str):
        raise bad_request("invalid_request_id", "requestId must be a string")
    params = FetchParams(
        group=check_name(p.get("consumer"), "consumer"),
        client_id=check_name(p.get("clientId"), "clientId", required=False),
        topic=check_public_topic(p.get("topic"), internal_topic_prefixes(s)),
        max_messages=p.integer("max", s.default_max_messages, 1, s.max_messages),
        wait_ms=p.integer("wait_ms", 0, 0, s.max_wait_ms),
        address=client_address(request),
        ack_request_id=rid,
        credential=credential,
    )
    f = await gw.consume.fetch(params)  # a piggy-backed ack is counted by ConsumeService.on_ack
    metrics.fetched(f.status.value, f.count, bool(f.batch and f.batch.redelivered))
    body = fetched_body(f, gw.broker.name, encoding)
    if f.status is FetchStatus.RATE_LIMITED:
        retry_s = str(max(1, -(-f.retry_after_ms // 1000)))
        return JSON(body, status_code=429, headers={"Retry-After": retry_s})
    return JSON(body)


async def _request_id(request: Request) -> str:
    return _rid(await _params(request, BATCH_PARAMS))


def _rid(p: Params) -> str:
    rid = p.get("requestId")
    if rid is None or rid == "":
        raise bad_request("missing_request_id", "requestId is required")
    if not isinstance(rid, str):
        raise bad_request("invalid_request_id", "requestId must be a string")
    return rid


def _ack_response(r: AckResult, body: dict[str, Any]) -> Response:
    status = _ACK_STATUS[r.result]
    if status != 200:
        body["error"] = {"code": r.result.value if r.result is not AckOutcome.UNKNOWN
                         else "unknown_queue", "message": body["message"]}
    return JSON(body, status_code=status)


async def ack_route(request: Request) -> Response:
    """POST /ack; with ``failed`` (offsets of the batch that failed) it is a partial nack."""
    gw = _state(request)
    credential = api_credential(request)
    p = await _params(request, ACK_PARAMS, BATCH_PARAMS)
    failed = parse_failed(p.body.get("failed"))
    if failed:
        f = await gw.nack.fail(_rid(p), failed, credential)  # the commit is counted by on_ack
        metrics.failed(len(f.retried), len(f.dead))
        return _ack_response(f.ack, failed_body(f))
    r = await gw.consume.ack(_rid(p), credential)  # counted by on_ack
    return _ack_response(r, ack_body(r))


async def nack_route(request: Request) -> Response:
    """POST /nack: the batch (or its ``failed`` offsets) failed; retried after ``delayMs`` or
    the consumer's retry policy, then dead-lettered; the batch is committed."""
    gw = _state(request)
    credential = api_credential(request)
    p = await _params(request, NACK_PARAMS, BATCH_PARAMS)
    failed = parse_failed(p.body.get("failed"))
    delay = parse_delay_ms(p.body.get("delayMs"))
    f = await gw.nack.fail(_rid(p), failed, credential, delay)
    metrics.failed(len(f.retried), len(f.dead))
    return _ack_response(f.ack, failed_body(f))


async def unlock_route(request: Request) -> Response:
    gw = _state(request)
    credential = api_credential(request)
    r = await gw.consume.unlock(await _request_id(request), credential)
    body: dict[str, Any] = {"result": r.result.value, "committedOffset": r.committed}
    status = _UNLOCK_STATUS[r.result]
    if status != 200:
        lost = r.result is UnlockOutcome.LOCK_LOST
        body["error"] = {"code": "lock_lost" if lost else "unknown_queue",
                         "message": "this batch no longer holds the queue's lock"
                         if lost else "no such queue for this consumer"}
    return JSON(body, status_code=status)


async def queues_route(request: Request) -> Response:
    gw = _state(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    group = check_name(request.path_params["group"], "consumer", internal_ok=True)
    client_id = check_name(request.path_params.get("client_id"), "clientId", required=False)
    await gw.auth.require_consumer(credential, group)
    cfg = await gw.registry.require_seen(group, client_id)  # a typo is a 404, not an empty list
    timeout = int(cfg.get("consume_timeout_ms") or gw.settings.consume_timeout_ms)
    out = [{
        "topic": r.topic, "queue": r.queue,
        "maxOffset": r.max_offset, "committedOffset": r.committed, "backlog": r.backlog,
        "locked": r.locked(timeout), "lockAgeMs": r.lock_age_ms, "lockToken": r.token,
        "lastAccessMs": r.last_access_ms, "lastAccessAgeMs": r.last_access_age_ms,
        "lastClientAddress": r.address,
    } for r in await queue_rows(gw.store, group, client_id)]
    return JSON({"consumer": group, "clientId": client_id or None, "consumeTimeoutMs": timeout,
                 "queues": out})


async def clients_route(request: Request) -> Response:
    gw = _state(request)
    credential = api_credential(request)
    check_query(request, NO_PARAMS)
    group = check_name(request.path_params["group"], "consumer", internal_ok=True)
    await gw.auth.require_consumer(credential, group)
    await gw.registry.require_seen(group)
    now = now_ms()
    clients = [{"clientId": c, "lastSeenMs": ts, "idleMs": now - ts}
               for c, ts in await gw.store.clients(group)]
    return JSON({"consumer": group, "idleExpiryMs": gw.settings.client_idle_ms, "clients": clients})


async def metrics_route(request: Request) -> Response:
    """``GET /metrics`` in the Prometheus text format."""
    return Response(await metrics.render(), headers={"content-type": metrics.CONTENT_TYPE_LATEST})


async def healthz(request: Request) -> Response:
    return JSON({"status": "ok"})


async def readyz(request: Request) -> Response:
    gw = _state(request)
    checks = {"redis": False, "broker": False}
    try:
        checks["redis"] = await gw.store.ping()
    except Exception:  # noqa: BLE001 - any failure means not ready
        pass
    checks["broker"] = await gw.broker.ping()
    ok = all(checks.values())
    return JSON({"status": "ok" if ok else "unavailable", "checks": checks},
                status_code=200 if ok else 503)


async def openapi_route(request: Request) -> Response:
    spec = _state(request).openapi
    if not spec:
        raise ApiError(404, "not_found", "openapi.yaml is not installed with this gateway")
    return Response(spec, media_type="application/yaml")


data_routes = [
    route("/metrics", metrics_route, methods=["GET"]),
    route("/produce", key_first(produce_route), methods=["POST"]),
    route("/delayed/{delay_id}", key_first(cancel_delayed_route), methods=["DELETE"]),
    route("/message", key_first(message_route), methods=["GET", "POST"]),
    route("/ack", key_first(ack_route), methods=["POST"]),
    route("/nack", key_first(nack_route), methods=["POST"]),
    route("/unlock", key_first(unlock_route), methods=["POST"]),
    # Matched in order, one regex each: the hot paths first, then the probes.
    route("/healthz", healthz, methods=["GET"]),
    route("/readyz", readyz, methods=["GET"]),
    route("/consumers/{group}/queues", key_first(queues_route), methods=["GET"]),
    route("/consumers/{group}/clients", key_first(clients_route), methods=["GET"]),
    route("/consumers/{group}/clients/{client_id}/queues", key_first(queues_route), methods=["GET"]),
    route("/openapi.yaml", openapi_route, methods=["GET"]),
]
