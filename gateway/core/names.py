"""Validation of names that end up in Redis keys and broker requests."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
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


def _folded(name: str) -> str:
    """A topic name as collisions see it: Kafka takes ``.`` and ``_`` for one character (its
    metric names do), and a case-insensitive file system (or an operator) takes ``MQGW`` for
    ``mqgw``: a user's ``mqgw_delay_l0`` or ``MQGW.delay.l0`` would block the gateway's own
    ``mqgw.delay.l0`` when the wheel made it later."""
    return name.lower().replace(".", "_")


def _nothing(topic: str) -> bool:
    return False


@dataclass(frozen=True)
class InternalTopics:
    """The one rule for topics nobody may name through the API: the gateway's own (``prefixes``,
    from :func:`internal_topic_prefixes`, compared folded (:func:`_folded`): written only with
    the wheel's headers, which a record from elsewhere lacks, so the relay drops it) and the
    broker's own (``broker``: :meth:`Broker.owns_topic`, whose rules only its adapter knows:
    Kafka's ``__consumer_offsets``, RocketMQ's timer log ``rmq_sys_wheel_timer``, which holds
    every pending timer record of every topic)."""

    prefixes: tuple[str, ...] = ()
    broker: Callable[[str], bool] = _nothing

    @classmethod
    def of(cls, settings: Settings, broker: Callable[[str], bool] = _nothing) -> InternalTopics:
        return cls(tuple(_folded(p) for p in internal_topic_prefixes(settings)), broker)

    def __contains__(self, topic: object) -> bool:
        return isinstance(topic, str) and (_folded(topic).startswith(self.prefixes)
                                           or self.broker(topic))


def check_public_topic(v: Any, internal: InternalTopics) -> str:
    """A topic name (:func:`check_topic`) that is not internal (:class:`InternalTopics`):
    ``403 internal_topic`` wherever a topic is named, to produce, fetch, register, dead-letter,
    reset or redrive to."""
    topic = check_topic(v)
    if topic in internal:
        raise denied("internal_topic", f"topic {topic!r} is one of the gateway's own (delay "
                     "levels, retry topics, or a name that collides with them) or the broker's: "
                     "name the record's own topic (with delayMs or deliverAt for a delay)")
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
