"""Domain errors: what went wrong, in the core's words, with a stable machine-readable code.

The core never speaks HTTP. It raises one of these kinds, and ``gateway.api.errors`` holds the
one table that turns a kind into a status (and a JSON body ``{"error": {"code", "message"}}``).
A new kind is added here and there, nowhere else.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """A refusal the caller can act on: ``code`` is stable, ``message`` is for people."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class Invalid(DomainError):
    """The request itself is wrong (a missing or malformed field)."""


class Unauthenticated(DomainError):
    """No valid API key was presented."""


class Forbidden(DomainError):
    """The key is valid but may not do this, or the registry does not allow it."""


class NotFound(DomainError):
    """The named consumer, producer, key, topic or queue does not exist."""


class Conflict(DomainError):
    """The thing is in a state that does not allow this any more (a delayed record that was
    already delivered cannot be cancelled)."""


class TooLarge(DomainError):
    """Over a configured limit (batch size, header count); ``details['limit']`` names it."""


class Busy(DomainError):
    """Not now, but soon: the caller should retry."""


# Short constructors, read like the refusals they make.
def bad_request(code: str, message: str, **details: Any) -> Invalid:
    return Invalid(code, message, **details)


def not_found(code: str, message: str, **details: Any) -> NotFound:
    return NotFound(code, message, **details)


def unauthorized(code: str, message: str) -> Unauthenticated:
    return Unauthenticated(code, message)


def forbidden(code: str, message: str, **details: Any) -> Forbidden:
    return Forbidden(code, message, **details)
