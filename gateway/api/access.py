"""The front of the app: request ids in and out, error answers, request metrics, one access line.

Starlette wraps an app in three layers per request (``ServerErrorMiddleware``, the user's
middleware, ``ExceptionMiddleware``) and each route in a fourth (``request_response``, which
looks the exception handlers up again). Every layer is an await, a ``send`` closure and, for
two of them, a ``Request`` object. On a no-op request on one worker that was measurable:
:class:`App` serves its routes through one layer, :class:`Front`, which does all of it, and
:func:`route` makes routes whose endpoint is called without starlette's per-route wrapper.
Exceptions from an endpoint or from the router (404, 405) reach :class:`Front`, which answers
with the app's handler for them; so error answers now carry the request id too.

The access log writes a line for every error answer (400 and up) and for a random share
``access_log_sample`` of the others (1 in 100 by default): at a line per request it was the
largest thing a node wrote, ~250 MB an hour per node at 2,000 records/s, for lines nobody reads
while every request is counted in the metrics anyway (docs/operations.md, Log volume;
BENCHMARKS.md, issue 20).

HTTP (ASGI) lives here; the log format and the metrics themselves are :mod:`gateway.ops`'.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from random import random
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, ExceptionHandler, Lifespan, Message, Receive, Scope, Send

from ..core.registry_copy import COPY_PENDING
from ..ops import metrics
from ..ops.logs import access_log, log_access, new_request_id, request_id
from .drain import DRAIN

#: On the answer to a registry write that is applied (in Redis) but whose durable copy the broker
#: did not take yet (core/registry_copy.py: sent again until it does).
_COPY_PENDING_HEADER = (b"mqgw-durable-copy", b"pending")

#: The answer to a request the node's stop cut (api/drain.py): another node takes the retry.
SHUTTING_DOWN = {"error": {"code": "shutting_down",
                           "message": "this gateway node is stopping; retry (another node answers)"}}

_HEADER = b"x-request-id"
_SANE_ID = re.compile(rb"[A-Za-z0-9._-]{1,128}")


def _incoming_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == _HEADER:
            return value.decode("ascii") if _SANE_ID.fullmatch(value) else None
    return None


def route_template(scope: Scope) -> str:
    """The matched route's path template, from what starlette's router left in the scope.

    Starlette 1.x sets ``scope["route"]`` to the matched route, also on a method mismatch
    (405), so this is a dict lookup. Nothing set means no route matched (404), unless this
    starlette predates that: then the app's top-level routes are matched again.
    """
    if "route" not in scope and "endpoint" in scope:
        return _match_again(scope)
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str) or isinstance(route, Mount):  # a Mount left there: nothing inside matched
        return "unmatched"
    root = scope.get("app_root_path")  # under a Mount, the mount's prefix (route.path is relative)
    if root is not None:
        path = scope.get("root_path", "")[len(root):] + path
    return path or "/"


def _match_again(scope: Scope) -> str:
    partial = "unmatched"
    for route in getattr(scope.get("app"), "routes", ()):
        if isinstance(route, Mount):
            continue
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return str(route.path)
        if match is Match.PARTIAL and partial == "unmatched":
            partial = str(route.path)
    return partial


Handler = Callable[[Request, Exception], Awaitable[Response]]


class Endpoint:
    """An ``async def (request) -> Response`` as an ASGI app, with no exception layer of its
    own: :class:`Front` answers for every exception, once."""

    __slots__ = ("func",)

    def __init__(self, func: Callable[[Request], Awaitable[Response]]) -> None:
        self.func = func

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.func(Request(scope, receive, send))
        await response(scope, receive, send)


def route(path: str, func: Callable[[Request], Awaitable[Response]], methods: list[str]) -> Route:
    """A route served through :class:`Endpoint` (starlette treats a non-function endpoint as an
    ASGI app and still answers 405 for other methods)."""
    return Route(path, Endpoint(func), methods=methods, name=func.__name__)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own answer to an HTTPException, for apps that do not bring theirs."""
    assert isinstance(exc, HTTPException)
    return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)


class Front:
    """Request id in, request id out, error answers, metrics and one access-log line per HTTP
    request: what starlette's two built-in layers and a middleware did, in one layer.

    The id is the client's ``X-Request-Id`` when it is 1-128 characters of ``[A-Za-z0-9._-]``,
    else a fresh one (:func:`new_request_id`). It is set in :data:`request_id` for the whole
    request, so every log line the request causes carries it, and returned as ``x-request-id``.

    An exception before the response started is answered by the most specific handler in
    ``handlers`` (by the exception's class hierarchy; ``Exception`` is the catch-all that
    logs the traceback and answers 500). After the response started nothing can be answered:
    it is re-raised for the server to log and to close the connection, and counted with the
    status already sent.

    Only ``http.response.start`` is looked at, so long polls and streamed bodies pass through
    untouched. The duration runs until the app returns, i.e. until the body is fully sent.

    The access line is written for every answer of 400 and up, and for a random share
    ``access_log_sample`` (0 to 1) of the others; metrics count every request either way.
    """

    def __init__(self, app: ASGIApp, handlers: Mapping[Any, Handler], access_log: bool = True,
                 access_log_sample: float = 1.0) -> None:
        self.app = app
        self.handlers: dict[Any, Handler] = {HTTPException: _http_exception, **handlers}
        self.access_log = access_log
        self.sample = access_log_sample
        # For starlette's own per-route wrapper, if a route is made without route().
        self._starlette_handlers = ({k: v for k, v in self.handlers.items() if not isinstance(k, int)},
                                    {k: v for k, v in self.handlers.items() if isinstance(k, int)})

    def _handler(self, exc: Exception) -> Handler | None:
        for cls in type(exc).__mro__:
            h = self.handlers.get(cls)
            if h is not None:
                return h
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope["starlette.exception_handlers"] = self._starlette_handlers
        rid = _incoming_id(scope["headers"]) or new_request_id()
        token = request_id.set(rid)
        extra_header = (_HEADER, rid.encode("ascii"))
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # A new list: the response may reuse its own header list.
                headers = [*message.get("headers", ()), extra_header]
                if COPY_PENDING.get():  # a registry write applied, its durable copy pending
                    headers.append(_COPY_PENDING_HEADER)
                message = {**message, "headers": headers}
            await send(message)

        start = time.perf_counter()
        ok = False
        task = asyncio.current_task()
        if task is not None:
            DRAIN.running.add(task)
        try:
            try:
                await self.app(scope, receive, send_with_id)
            except Exception as exc:
                handler = None if status else self._handler(exc)
                if handler is None:
                    raise
                response = await handler(Request(scope, receive, send), exc)
                await response(scope, receive, send_with_id)
                exc.__traceback__ = None  # a reused exception instance would pile up tracebacks
            except asyncio.CancelledError:
                if task is None or not DRAIN.was_cut(task):
                    raise  # the client went away, or the server cancels: not ours to answer
                task.uncancel()  # the drain's own cancel (api/drain.py): answered here
                if not status:
                    await JSONResponse(SHUTTING_DOWN, status_code=503, headers={"Retry-After": "1"})(
                        scope, receive, send_with_id)
            ok = True
        finally:
            if task is not None:
                DRAIN.running.discard(task)
            elapsed = time.perf_counter() - start
            if not status:  # no response was started: the server sends a 500
                status = 500
            route = route_template(scope)
            metrics.observe_request(route, scope["method"], status, elapsed)
            # random() < 1 always holds: a sample of 1 logs every request
            if self.access_log and (status >= 400 or random() < self.sample) \
                    and access_log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                log_access(scope["method"], scope["path"], route, status, round(elapsed * 1000, 3),
                           f"{client[0]}:{client[1]}" if client else None, rid)
            # After an unanswered exception the id stays set for the server's own error log;
            # the server runs each request in its own task, so it does not leak into the next.
            if ok:
                request_id.reset(token)


class App(Starlette):
    """Starlette whose whole middleware stack is one :class:`Front` around the router.

    ``exception_handlers`` maps exception classes (``Exception`` for the 500 answer) to
    ``async (request, exc) -> Response``. There is no ``middleware``: a layer between
    :class:`Front` and the router would be the per-request cost this removes.
    ``access_log_sample``: the share of answers below 400 that get an access line (all here;
    the gateway's is the setting of that name).
    """

    def __init__(self, routes: Sequence[BaseRoute], *,
                 exception_handlers: Mapping[Any, ExceptionHandler] | None = None,
                 lifespan: Lifespan[Any] | None = None, access_log: bool = True,
                 access_log_sample: float = 1.0) -> None:
        super().__init__(routes=routes, exception_handlers=exception_handlers, lifespan=lifespan)
        self.access_log = access_log
        self.access_log_sample = access_log_sample

    def build_middleware_stack(self) -> ASGIApp:
        return Front(self.router, self.exception_handlers, self.access_log, self.access_log_sample)
