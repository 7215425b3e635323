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


# Short constructors, named for what happened (which status that is, is gateway.api.errors'
# business): ``raise unknown("unknown_queue", ...)`` reads like the refusal it makes.
def invalid(code: str, message: str, **details: Any) -> Invalid:
    """The input is wrong."""
    return Invalid(code, message, **details)


def unknown(code: str, message: str, **details: Any) -> NotFound:
    """The named thing does not exist."""
    return NotFound(code, message, **details)


def unauthenticated(code: str, message: str) -> Unauthenticated:
    """No valid API key: the caller is nobody we know."""
    return Unauthenticated(code, message)


def denied(code: str, message: str, **details: Any) -> Forbidden:
    """Known, but not allowed to do this."""
    return Forbidden(code, message, **details)
