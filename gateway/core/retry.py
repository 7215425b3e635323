"""Retry policies, retry and dead-letter topic names, and the headers a retried record carries.

A record a consumer fails (``/nack``, or ``failed`` offsets on ``/ack``) is written through the
delay wheel to that consumer's own *retry topic* for the topic it read (other consumers of the
topic never see it again), and ``/message`` serves the retry topic's queues beside the topic's
(core/fetch.py). After its last attempt it goes to the consumer's dead-letter topic instead.
Where it came from, which attempt comes next and when it first went out travel in ``mqgw-*``
headers, so a retry topic is read like any other and no node remembers anything.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from ..broker import Record
from ..config import Settings
from .errors import invalid
from .wheel import H_DUE, H_ID

#: The delivery attempt a record is on (1: its first delivery, from the topic itself).
H_ATTEMPT = "mqgw-attempt"
#: When the record was first handed out (unix ms), kept across attempts.
H_FIRST = "mqgw-first-delivery-ms"
#: When it last failed (unix ms): the nack that sent it here.
H_FAILED = "mqgw-last-failure-ms"
#: Where it was produced: topic, partition (queue) and offset, kept across attempts; a redrive
#: sends it back there.
H_ORIGIN_TOPIC = "mqgw-origin-topic"
H_ORIGIN_QUEUE = "mqgw-origin-partition"
H_ORIGIN_OFFSET = "mqgw-origin-offset"
#: The record's own timestamp. A retried record is written with the broker's time instead: a
#: week-old record retried keeps its original time here, not where Kafka's time-based retention
#: would delete its segment before the retry is due.
H_ORIGIN_TS = "mqgw-origin-timestamp"
#: The consumer that failed it, and in broadcast mode its clientId: whose retries these are
#: (a redrive of a shared dead-letter topic sends each back to its own consumer).
H_CONSUMER = "mqgw-consumer"
H_CLIENT = "mqgw-client-id"
#: Headers the gateway sets on a retried record and strips before setting them again.
OWN_HEADERS = frozenset({H_ATTEMPT, H_FIRST, H_FAILED, H_ORIGIN_TOPIC, H_ORIGIN_QUEUE,
                         H_ORIGIN_OFFSET, H_ORIGIN_TS, H_CONSUMER, H_CLIENT, H_DUE, H_ID})
_MAX_TOPIC = 249


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a consumer's record is retried, after which delays, and where it ends up."""

    max_attempts: int  # deliveries in all, the first one included
    initial_delay_ms: int
    multiplier: float
    max_delay_ms: int
    delays_ms: tuple[int, ...]  # the delay before each retry (seed 001); empty: the exponential
    dead_letter_topic: str

    @classmethod
    def of(cls, consumer: str, cfg: dict[str, str], settings: Settings,
           max_topic: int = _MAX_TOPIC) -> RetryPolicy:
        """The consumer's policy from its config hash, the gateway's defaults filling the gaps.
        A ``delaysMs`` schedule without ``maxAttempts`` allows one retry per listed delay."""
        delays = tuple(int(d) for d in cfg.get("retry_delays_ms", "").split(",") if d)
        attempts = cfg.get("retry_max_attempts")
        return cls(
            max_attempts=int(attempts) if attempts else
            (len(delays) + 1 if delays else settings.retry_max_attempts),
            initial_delay_ms=int(cfg.get("retry_initial_delay_ms") or settings.retry_initial_delay_ms),
            multiplier=float(cfg.get("retry_multiplier") or settings.retry_multiplier),
            max_delay_ms=int(cfg.get("retry_max_delay_ms") or settings.retry_max_delay_ms),
            delays_ms=delays,
            dead_letter_topic=cfg.get("retry_dead_letter_topic") or dead_letter_topic(
                settings.dead_letter_prefix, consumer, max_topic))

    def delay_before(self, attempt: int) -> int:
        """The wait (ms) between a failure and delivery ``attempt`` (2 = the first retry). A
        schedule's last delay repeats when ``maxAttempts`` allows more retries than it lists."""
        n = max(1, attempt - 1)  # which retry this is
        if self.delays_ms:
            return self.delays_ms[min(n, len(self.delays_ms)) - 1]
        if self.initial_delay_ms <= 0:
            return 0
        # initial x multiplier^(n-1), capped without computing a power that overflows a float
        if self.multiplier > 1 and (n - 1) * math.log(self.multiplier) >= \
                math.log(max(1, self.max_delay_ms) / self.initial_delay_ms):
            return self.max_delay_ms
        return min(self.max_delay_ms, round(self.initial_delay_ms * self.multiplier ** (n - 1)))


#: The exponential policy's hash fields; a ``delaysMs`` schedule (``retry_delays_ms``) replaces
#: them all, so a policy holds one or the other.
EXPONENTIAL_FIELDS = ("retry_initial_delay_ms", "retry_multiplier", "retry_max_delay_ms")


def check_policy_fields(cfg: dict[str, str]) -> None:
    """Refuse a config hash whose retry policy mixes a schedule with the exponential fields:
    :meth:`RetryPolicy.of` would follow the schedule and silently ignore the others."""
    if cfg.get("retry_delays_ms") and any(cfg.get(f) for f in EXPONENTIAL_FIELDS):
        raise invalid("conflicting_retry", "retry.delaysMs (a delay per retry) replaces "
                      "initialDelayMs, multiplier and maxDelayMs (exponential delays): give "
                      "one or the other (in a PATCH, null the others to switch)")


def retry_topic(prefix: str, consumer: str, topic: str, client_id: str = "",
                max_len: int = _MAX_TOPIC) -> str:
    """The retry topic of ``consumer`` (and in broadcast mode of its ``client_id``) for ``topic``:
    readable, and made unique by a digest of the three names (names may contain dots, so
    ``a.b`` + ``c`` and ``a`` + ``b.c`` must not meet), within the broker's longest topic name
    (``max_len``: Kafka's 249 characters, RocketMQ's 127)."""
    digest = hashlib.sha256(f"{consumer}\0{topic}\0{client_id}".encode()).hexdigest()[:10]
    readable = f"{consumer}.{topic}" + (f".{client_id}" if client_id else "")
    room = max_len - len(prefix) - len(digest) - 1
    return f"{prefix}{readable[:room]}.{digest}"


def dead_letter_topic(prefix: str, consumer: str, max_len: int = _MAX_TOPIC) -> str:
    return f"{prefix}{consumer}"[:max_len]


def header(r: Record, name: str) -> str | None:
    """The last value of header ``name`` (as text), None if the record has none."""
    for n, v in reversed(r.headers):
        if n == name:
            return v.decode("utf-8", "replace") if v is not None else None
    return None


def attempt_of(r: Record) -> int:
    """Which delivery attempt this record is on: 1 unless a retry topic holds it."""
    v = header(r, H_ATTEMPT)
    return int(v) if v is not None and v.isdigit() and 0 < int(v) < 1 << 31 else 1
