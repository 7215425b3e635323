"""Validation of names that end up in Redis keys and broker requests."""

from __future__ import annotations

import re
from typing import Any

from .errors import bad_request

# No ':', '{' or '}': names are embedded in Redis keys and hash fields.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def check_topic(v: Any) -> str:
    if v is None or v == "":
        raise bad_request("missing_topic", "topic is required")
    if not isinstance(v, str) or not _TOPIC.fullmatch(v):
        raise bad_request("invalid_topic", "topic must be 1-249 characters of [A-Za-z0-9._-]")
    return v


def check_name(v: Any, what: str, required: bool = True) -> str:
    """Check a consumer group or clientId; error codes are ``missing_<what>`` / ``invalid_<what>``."""
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", what).lower()
    if v is None or v == "":
        if required:
            raise bad_request(f"missing_{code}", f"{what} is required")
        return ""
    if not isinstance(v, str) or not _NAME.fullmatch(v):
        raise bad_request(f"invalid_{code}", f"{what} must be 1-200 characters of [A-Za-z0-9._-]")
    return v
