"""The one mapping from domain errors to HTTP: status, headers and the JSON error body.

Every failure leaves as ``{"error": {"code", "message", "details"?}}``. The core raises
:class:`~gateway.core.errors.DomainError` kinds, the broker and the store raise their own
"unavailable" errors, and only this module knows which status each one is.
"""

from __future__ import annotations

from typing import Any

from ..broker import BrokerUnavailable
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
