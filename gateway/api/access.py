"""The access middleware: request ids in and out, request metrics, one access-log line each.

HTTP (ASGI) lives here; the log format and the metrics themselves are :mod:`gateway.ops`'.
"""

from __future__ import annotations

import logging
import re
import time

from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..ops import metrics
from ..ops.logs import access_log, log_access, new_request_id, request_id

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


class RequestContext:
    """Request id in, request id out, metrics and one access-log line per HTTP request.

    The id is the client's ``X-Request-Id`` when it is 1-128 characters of ``[A-Za-z0-9._-]``,
    else a fresh one (:func:`new_request_id`). It is set in :data:`request_id` for the whole
    request, so every log line the request causes carries it, and returned as ``x-request-id``.

    Only ``http.response.start`` is looked at, so long polls and streamed bodies pass through
    untouched. The duration runs until the app returns, i.e. until the body is fully sent.
    Responses made by starlette's ``ServerErrorMiddleware`` (unhandled exceptions, outside any
    user middleware) are counted as 500 but do not carry the header.
    """

    def __init__(self, app: ASGIApp, access_log: bool = True) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope["headers"]) or new_request_id()
        token = request_id.set(rid)
        extra_header = (_HEADER, rid.encode("ascii"))
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # A new list: the response may reuse its own header list.
                message = {**message, "headers": [*message.get("headers", ()), extra_header]}
            await send(message)

        start = time.perf_counter()
        ok = False
        try:
            await self.app(scope, receive, send_with_id)
            ok = True
        finally:
            elapsed = time.perf_counter() - start
            if not status:  # no response was started: the server (or error middleware) sends a 500
                status = 500
            route = route_template(scope)
            metrics.observe_request(route, scope["method"], status, elapsed)
            if self.access_log and access_log.isEnabledFor(logging.INFO):
                client = scope.get("client")
                log_access(scope["method"], scope["path"], route, status, round(elapsed * 1000, 3),
                            f"{client[0]}:{client[1]}" if client else None, rid)
            # After an exception the id stays set for starlette's error handler, which logs the
            # traceback outside this middleware; the server runs each request in its own task,
            # so it does not leak into the next request.
            if ok:
                request_id.reset(token)
