"""Validation of names that end up in Redis keys and broker requests."""

from __future__ import annotations

import re
from typing import Any

from .errors import bad_request

# No ':', '{' or '}': names are embedded in Redis keys and hash fields.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: Kafka refuses these topic names, and as consumer names they become URL path segments that
#: HTTP clients and proxies resolve away (`/admin/consumers/..` is `/admin`).
_DOTS = (".", "..")
#: Consumer names that start with this are the gateway's own (the delay relay, the dead-letter
#: redrive positions): a public pause, reset or fetch of one would stop or lose delayed records.
INTERNAL_PREFIX = "_mqgw"


def check_topic(v: Any) -> str:
    if v is None or v == "":
        raise bad_request("missing_topic", "topic is required")
    if not isinstance(v, str) or not _TOPIC.fullmatch(v) or v in _DOTS:
        raise bad_request("invalid_topic", "topic must be 1-249 characters of [A-Za-z0-9._-], "
                          "not '.' or '..'")
    return v


def check_name(v: Any, what: str, required: bool = True, internal_ok: bool = False) -> str:
    """Check a consumer group or clientId; error codes are ``missing_<what>`` / ``invalid_<what>``.

    A consumer name of the gateway's own (:data:`INTERNAL_PREFIX`) is ``reserved_consumer``
    unless ``internal_ok`` (the read-only views, where operators watch the relay)."""
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", what).lower()
    if v is None or v == "":
        if required:
            raise bad_request(f"missing_{code}", f"{what} is required")
        return ""
    if not isinstance(v, str) or not _NAME.fullmatch(v) or v in _DOTS:
        raise bad_request(f"invalid_{code}", f"{what} must be 1-200 characters of [A-Za-z0-9._-], "
                          "not '.' or '..'")
    if what == "consumer" and not internal_ok and v.startswith(INTERNAL_PREFIX):
        raise bad_request("reserved_consumer", f"consumer names starting with {INTERNAL_PREFIX!r} "
                          "are the gateway's own (the delay relay, dead-letter redrive); they can "
                          "be watched in the queue views and the backlog, not used or changed")
    return v
