"""Validation of names that end up in Redis keys and broker requests."""

from __future__ import annotations

import re
from typing import Any

from ..config import Settings
from .errors import denied, invalid

# No ':', '{' or '}': names are embedded in Redis keys and hash fields.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: Kafka refuses these topic names, and as consumer names they become URL path segments that
#: HTTP clients and proxies resolve away (`/admin/consumers/..` is `/admin`).
_DOTS = (".", "..")
#: Consumer names that start with this are the gateway's own (the delay relay, the dead-letter
#: redrive positions): a public pause, reset or fetch of one would stop or lose delayed records.
INTERNAL_PREFIX = "_mqgw"


def internal_topic_prefixes(settings: Settings) -> tuple[str, ...]:
    """Prefixes of the topics the gateway writes itself: the delay levels, the retry topics and
    the registry's durable copy. ``/produce`` to them is ``internal_topic``; the lag report
    leaves them out by default (with the consumers named :data:`INTERNAL_PREFIX`), as no user
    produced to them."""
    return tuple(p for p in (settings.delay_topic_prefix, settings.retry_topic_prefix,
                             settings.registry_copy_topic()) if p)


#: The broker's own topics: Kafka's ``__consumer_offsets``, ``__transaction_state``,
#: ``__share_group_state``, ``__cluster_metadata`` (``__`` is Kafka's prefix for them).
BROKER_INTERNAL_PREFIX = "__"


def is_internal_topic(topic: str, prefixes: tuple[str, ...]) -> bool:
    """The one rule for topics nobody may name through the API: the gateway's own (``prefixes``,
    from :func:`internal_topic_prefixes`: written only with the wheel's headers, which a record
    from elsewhere lacks, so the relay drops it) and the broker's own."""
    return topic.startswith((*prefixes, BROKER_INTERNAL_PREFIX))


def check_public_topic(v: Any, prefixes: tuple[str, ...]) -> str:
    """A topic name (:func:`check_topic`) that is not internal (:func:`is_internal_topic`):
    ``403 internal_topic`` wherever a topic is named, to produce, fetch, register, dead-letter,
    reset or redrive to."""
    topic = check_topic(v)
    if is_internal_topic(topic, prefixes):
        raise denied("internal_topic", f"topic {topic!r} is one of the gateway's own (delay "
                     "levels, retry topics) or the broker's ('__…'): name the record's own "
                     "topic (with delayMs or deliverAt for a delay)")
    return topic


def check_topic(v: Any) -> str:
    if v is None or v == "":
        raise invalid("missing_topic", "topic is required")
    if not isinstance(v, str) or not _TOPIC.fullmatch(v) or v in _DOTS:
        raise invalid("invalid_topic", "topic must be 1-249 characters of [A-Za-z0-9._-], "
                      "not '.' or '..'")
    return v


def check_name(v: Any, what: str, required: bool = True, internal_ok: bool = False) -> str:
    """Check a consumer name or clientId; error codes are ``missing_<what>`` / ``invalid_<what>``.

    A consumer name of the gateway's own (:data:`INTERNAL_PREFIX`) is ``reserved_consumer``
    unless ``internal_ok`` (the read-only views, where operators watch the relay)."""
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", what).lower()
    if v is None or v == "":
        if required:
            raise invalid(f"missing_{code}", f"{what} is required")
        return ""
    if not isinstance(v, str) or not _NAME.fullmatch(v) or v in _DOTS:
        raise invalid(f"invalid_{code}", f"{what} must be 1-200 characters of [A-Za-z0-9._-], "
                      "not '.' or '..'")
    if what == "consumer" and not internal_ok and v.startswith(INTERNAL_PREFIX):
        raise invalid("reserved_consumer", f"consumer names starting with {INTERNAL_PREFIX!r} "
                      "are the gateway's own (the delay relay, dead-letter redrive); they can "
                      "be watched in the queue views and the backlog, not used or changed")
    return v
