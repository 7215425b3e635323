"""The one mapping from errors to HTTP: status, headers and the JSON error body.

Every failure leaves as ``{"error": {"code", "message", "details"?}}``. The core raises
:class:`~gateway.core.errors.DomainError` kinds, the broker and the store raise their own
"unavailable" errors, starlette its ``HTTPException`` (404, 405) and ``ClientDisconnect``; only
this module knows which status each one is (:data:`HANDLERS`, given to the app), which status
each ack and unlock outcome answers, and what the server answers on its own before a request
reaches the app (:func:`server_answer`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, cast

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ExceptionHandler

from ..broker import BrokerUnavailable, UnknownTopic
from ..core.errors import (
    Busy,
    Conflict,
    DomainError,
    Forbidden,
    Invalid,
    NotFound,
    TooLarge,
    Unauthenticated,
)
from ..ops import metrics
from ..store import UNAVAILABLE, AckOutcome, ExtendOutcome, UnlockOutcome
from .http import JSON

log = logging.getLogger("mqgw")

#: Status of each domain error kind (looked up along the class's MRO, most specific first).
STATUS: dict[type[DomainError], int] = {
    Invalid: 400, Unauthenticated: 401, Forbidden: 403, NotFound: 404, Conflict: 409, TooLarge: 413,
    Busy: 503,
}
_HEADERS: dict[type[DomainError], dict[str, str]] = {
    Unauthenticated: {"WWW-Authenticate": 'Bearer realm="mq-gateway"'},
    Busy: {"Retry-After": "1"},
}


class ApiError(Exception):
    """An error only the HTTP layer can make (body size, JSON syntax, methods)."""

    def __init__(self, status: int, code: str, message: str, *,
                 headers: dict[str, str] | None = None, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.details = details

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.details)


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if details:
        err["details"] = details
    return {"error": err}


def from_domain(e: DomainError) -> ApiError:
    """The HTTP form of a domain error."""
    for kind in type(e).__mro__:
        if kind in STATUS:
            return ApiError(STATUS[kind], e.code, e.message, headers=_HEADERS.get(kind),
                            **e.details)
    return ApiError(400, e.code, e.message, **e.details)


def unavailable_body(exc: Exception) -> tuple[str, dict[str, Any]]:
    """Which dependency failed, and what the client is told (the cause goes to the log only)."""
    dep = "broker" if isinstance(exc, BrokerUnavailable) else "redis"
    text = "the broker" if dep == "broker" else "Redis"
    return dep, error_body("unavailable", f"{text} is unavailable; retry shortly")


# -- outcomes that are not exceptions ----------------------------------------------------------
#: Status of each ack outcome (/ack, /nack, a piggy-backed ack); a stale batch is a 409.
ACK_STATUS = {AckOutcome.COMMITTED: 200, AckOutcome.ALREADY_COMMITTED: 200,
              AckOutcome.LOCK_LOST: 409, AckOutcome.OFFSET_RESET: 409,
              AckOutcome.OFFSET_MISMATCH: 409, AckOutcome.UNKNOWN: 404}
EXTEND_STATUS = {ExtendOutcome.EXTENDED: 200, ExtendOutcome.ALREADY_COMMITTED: 409,
                 ExtendOutcome.LOCK_LOST: 409, ExtendOutcome.OFFSET_RESET: 409,
                 ExtendOutcome.OFFSET_MISMATCH: 409, ExtendOutcome.NOT_LOCKED: 409,
                 ExtendOutcome.UNKNOWN: 404}
UNLOCK_STATUS = {UnlockOutcome.UNLOCKED: 200, UnlockOutcome.NOT_LOCKED: 200,
                 UnlockOutcome.LOCK_LOST: 409, UnlockOutcome.UNKNOWN: 404}
#: The status a request is counted and logged with when its client left before the body arrived
#: whole: nginx's "client closed request". Nobody receives it; it keeps those requests out of 500s.
CLIENT_CLOSED = 499


# -- exception handlers (the app's ``exception_handlers``) -------------------------------------
async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSON(exc.body(), status_code=exc.status, headers=exc.headers)


async def _domain_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DomainError)
    return await _api_error(request, from_domain(exc))


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSON(error_body(_HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail)),
                status_code=exc.status_code, headers=exc.headers)


async def _unknown_topic(request: Request, exc: Exception) -> Response:
    return JSON(error_body("unknown_topic", f"topic {str(exc)!r} does not exist"), status_code=404)


async def _unavailable(request: Request, exc: Exception) -> Response:
    dep, body = unavailable_body(exc)
    metrics.dependency_error(dep)
    log.warning("dependency unavailable on %s: %s", request.url.path, exc)
    # The cause (host, port, broker error) goes to the log, not to clients.
    return JSON(body, status_code=503, headers={"Retry-After": "1"})


async def _client_gone(request: Request, exc: Exception) -> Response:
    log.info("client disconnected before its request body arrived whole on %s", request.url.path)
    return JSON(error_body("client_closed_request", "client disconnected"), status_code=CLIENT_CLOSED)


async def _internal(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return JSON(error_body("internal", "internal error"), status_code=500)


#: The most specific class of an exception picks its handler (``Exception``: the 500 answer).
HANDLERS: dict[Any, ExceptionHandler] = {
    ApiError: _api_error,
    DomainError: _domain_error,
    HTTPException: _http_error,
    ClientDisconnect: _client_gone,
    UnknownTopic: _unknown_topic,
    BrokerUnavailable: _unavailable,
    **dict.fromkeys(UNAVAILABLE, _unavailable),  # Redis unreachable, failing over, read-only
    Exception: _internal,
}


async def answer(request: Request, exc: Exception) -> Response:
    """The app's answer to ``exc``: its most specific handler's (a route that answers errors in
    another shape, api/v2.py, starts from this one)."""
    for kind in type(exc).__mro__:
        handler = HANDLERS.get(kind)
        if handler is not None:  # all of them are ``async (Request, Exception) -> Response``
            return await cast(Callable[[Request, Exception], Awaitable[Response]], handler)(
                request, exc)
    raise exc  # not an Exception: nothing answers it


# -- answers the server writes itself (gateway/api/server.py) ----------------------------------
def server_answer(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response in the API's error shape, ending the connection: for what the
    server refuses before any application sees the request (too many connections, a head too
    slow or too large)."""
    body = json.dumps(error_body(code, message)).encode()
    extra = "".join(f"{k.lower()}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"{extra}connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


#: Over ``max_connections_per_worker``: refused at once.
TOO_MANY_CONNECTIONS = server_answer(
    503, "too_many_connections", "this gateway process holds as many connections as it may; "
    "retry shortly", {"Retry-After": "1"})
#: The request head did not arrive whole within ``header_timeout_ms``.
REQUEST_TIMEOUT = server_answer(408, "request_timeout", "the request head did not arrive in time")


def head_too_large(problem: str) -> bytes:
    """A head over ``max_head_bytes`` or ``max_headers``."""
    return server_answer(431, "headers_too_large", problem)
