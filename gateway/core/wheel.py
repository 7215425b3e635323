"""The delay wheel's arithmetic: level topics, hops and due times (seed 000), with no I/O.

A broker without native delay (Kafka) holds a delayed record in *level topics*, one per fixed
delay L. A record is written to level L at time t with ``hop due = t + L``; since every record
of that topic waits the same L, records are appended in hop-due order and the head of each
partition is always the next one due, so the relay only ever looks at heads. At its hop due the
relay sends the record on: to the largest level that does not overshoot the record's own due
time, or to its topic once less than the smallest level remains. Each hop is chosen from the
absolute due time, so a late hop makes the next one shorter and lateness never adds up over
hops; a delay longer than the top level loops on it, so there is no maximum.

With the default levels (1-9 x 100 ms, 1 s, 10 s, 100 s, 1000 s: 45 topics, the top 2.5 h) a
record makes at most one hop per decimal digit of its delay in 100 ms units, plus one loop per
2.5 h beyond that: 30 s takes at most 3 hops, a day 11, two years about 7,000 (one every 2.5 h,
a few bytes each).

A remainder shorter than the smallest level is waited out in memory by whoever holds the record
then (the produce request, or the relay holding the queue's lock): at most that level (100 ms).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ..config import parse_duration

#: 1-9 x 100 ms, 1 s, 10 s, 100 s and 1000 s.
DEFAULT_LEVELS_MS: tuple[int, ...] = tuple(d * 10 ** k for k in range(2, 7) for d in range(1, 10))

# Headers a record carries while it is in the wheel; removed when it reaches its topic, but for
# H_DUE, a delivered record saying when it was due (consumers can tell how late it came), and
# H_ID, its delay id: a record the wheel delivered more than once (a relay that stalled past its
# lock and sent again) comes with the same id each time, so a consumer can deduplicate on it.
H_TOPIC = "mqgw-delay-topic"
H_DUE = "mqgw-delay-due"
H_HOP_DUE = "mqgw-delay-hop-due"
H_ID = "mqgw-delay-id"
H_PARTITION = "mqgw-delay-partition"
H_TIMESTAMP = "mqgw-delay-timestamp"
WHEEL_HEADERS = frozenset({H_TOPIC, H_DUE, H_HOP_DUE, H_ID, H_PARTITION, H_TIMESTAMP})
#: Removed on delivery.
INTERNAL_HEADERS = WHEEL_HEADERS - {H_DUE, H_ID}


def parse_levels(spec: str) -> tuple[int, ...]:
    """Levels from a comma-separated list of durations (``100ms,1s,10s``; a bare number is
    seconds); '' gives :data:`DEFAULT_LEVELS_MS`."""
    if not spec.strip():
        return DEFAULT_LEVELS_MS
    levels = sorted({round(parse_duration(p) * 1000) for p in spec.split(",") if p.strip()})
    if not levels or levels[0] < 1:
        raise ValueError(f"delay levels must be 1 ms or more: {spec!r}")
    return tuple(levels)


@dataclass(frozen=True, slots=True)
class Wheel:
    """The configured levels and the names of their topics."""

    levels: tuple[int, ...] = DEFAULT_LEVELS_MS
    topic_prefix: str = "mqgw.delay."

    @property
    def smallest(self) -> int:
        return self.levels[0]

    def topic(self, level_ms: int) -> str:
        return f"{self.topic_prefix}{level_ms}ms"

    def topics(self) -> list[str]:
        return [self.topic(level) for level in self.levels]

    def level_for(self, remaining_ms: int) -> int | None:
        """The largest level that does not overshoot ``remaining_ms``; None if it is shorter
        than the smallest (then the holder waits it out and writes to the record's topic)."""
        i = bisect_right(self.levels, remaining_ms)
        return self.levels[i - 1] if i else None

    def ready_at(self, hop_due: int, due: int) -> int:
        """The earliest time the relay acts on a record of a level: at its hop due, unless
        less than the smallest level is left then (it is written to its topic at ``due``)."""
        return due if 0 < due - hop_due < self.smallest else hop_due

    def act_by(self, hop_due: int, due: int, slack_ms: int) -> int:
        """The latest time the relay should act on it. A record that goes to its topic next
        must go at its due time. One that goes to another level may wait up to ``slack_ms``
        longer (never so long that less than the smallest level is left): the next level is
        chosen from the time left, so a late hop costs no punctuality, and relays then move
        a steady stream of hops in one step per ``slack_ms`` instead of one per record."""
        if due - hop_due < self.smallest:
            return max(hop_due, due)
        return hop_due + min(slack_ms, due - hop_due - self.smallest)

    def plan(self, delay_ms: int) -> tuple[int, list[int]]:
        """The hops of a record delayed by ``delay_ms`` when every hop is on time: how many
        loops on the top level, then the levels after them (the tests check the arithmetic with
        it, from 1 ms to years, without waiting)."""
        top = self.levels[-1]
        loops = max(0, delay_ms // top - 1)  # the last top-level hop is in the list
        hops: list[int] = []
        remaining = delay_ms - loops * top
        while (level := self.level_for(remaining)) is not None:
            hops.append(level)
            remaining -= level
        return loops, hops
