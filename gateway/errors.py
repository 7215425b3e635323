"""Client-facing errors: every failure leaves as JSON ``{"error": {"code", "message"}}``.

Handlers raise :class:`ApiError`; the app turns it (and anything unexpected)
into a response, so no handler builds error bodies by hand.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error with an HTTP status and a stable, machine-readable code."""

    def __init__(self, status: int, code: str, message: str, *,
                 headers: dict[str, str] | None = None, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.details = details

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            err["details"] = self.details
        return {"error": err}


def bad_request(code: str, message: str, **details: Any) -> ApiError:
    return ApiError(400, code, message, **details)


def not_found(code: str, message: str, **details: Any) -> ApiError:
    return ApiError(404, code, message, **details)


def unauthorized(code: str, message: str) -> ApiError:
    return ApiError(401, code, message, headers={"WWW-Authenticate": 'Bearer realm="mq-gateway"'})


def forbidden(code: str, message: str, **details: Any) -> ApiError:
    return ApiError(403, code, message, **details)


class BrokerUnavailable(Exception):
    """The broker did not answer in time; mapped to 503 so clients retry."""
