"""How late the delay wheel is: the record in the level topics longest past the time the relay
should have moved it.

A relay moves each level queue's head when it is due (core/relay.py), so a head more than a
moment past its time means no relay is moving that queue: every node runs with ``relay=false``
and no ``mqgw relay`` runs, or the relays are stalled. Nothing is lost (records wait in the level
topics) but delayed records and retries come late, and nothing else says so: the alert monitor
reports it as the built-in alert of the relay's consumer (ops/alerts.py).

Per evaluation: the relay consumer's committed offsets (one Redis read), each level topic's
shared watermarks (the same lease-guarded refresh the views use) and one broker read of the head
record of each level queue that holds records, its wheel headers saying when it is due.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ..core.relay import IDLE_S, RELAY_CONSUMER
from ..core.watermarks import Watermarks
from ..core.wheel import H_DUE, H_HOP_DUE, Wheel
from ..store import now_ms
from .backlog import PEEK_BUDGET_S, PEEK_CONCURRENCY, head_record

#: How old the level topics' shared watermarks may be before an evaluation refreshes them.
LEVELS_REFRESH_MS = int(IDLE_S * 1000)


@dataclass(frozen=True, slots=True)
class WheelLag:
    #: How long past its time the most overdue head is (0: none; None: could not tell). A relay
    #: at work keeps it within its coalescing window and hop slack (core/wheel.py act_by).
    overdue_ms: int | None
    waiting: int  # offsets of the level topics not yet moved (records; on Kafka also markers)
    levels: int  # level topics that exist (0: no wheel: this gateway never delayed a record)


async def wheel_lag(gw: Any, wheel: Wheel) -> WheelLag:
    """The wheel's lateness now (``gw``: settings, store and broker, as backlog.view takes)."""
    read = await gw.store.read_consumers([RELAY_CONSUMER])
    committed = {(q.topic, q.queue): q.committed for c in read for q in c.queues if q.has_offset}
    # The relays keep the level topics' shared copies fresh (every IDLE_S, and their writes
    # raise them); a copy that age is read as is, not refreshed by every evaluation.
    wm = Watermarks(gw.store, gw.broker, max(gw.settings.metadata_refresh_ms, LEVELS_REFRESH_MS))
    sem = asyncio.Semaphore(PEEK_CONCURRENCY)

    async def shared(topic: str) -> dict[str, tuple[int, int]]:
        async with sem:
            return (await wm.shared(topic)).queues

    # Only the levels that exist (one listing): a gateway that never delayed a record has none.
    existing = await gw.broker.topics(wheel.topic_prefix)
    topics = [t for t in wheel.topics() if t in existing]
    marks = dict(zip(topics, await asyncio.gather(*(shared(t) for t in topics)), strict=True))
    heads = {(t, q): max(lo, committed.get((t, q), lo))
             for t, queues in marks.items() for q, (lo, hi) in queues.items()
             if hi > max(lo, committed.get((t, q), lo))}
    waiting = sum(marks[t][q][1] - at for (t, q), at in heads.items())
    now = now_ms()
    lateness: list[int] = []
    unknown = False

    async def one(topic: str, queue: str, at: int) -> None:
        nonlocal unknown
        async with sem:
            r = await head_record(gw.broker, topic, queue, at)
        if r is None:  # nothing readable there (Kafka's transaction markers after the relay's
            return     # last hop), or the broker did not answer (logged): no verdict from it
        hdr = dict(r.headers)
        try:
            hop_due, due = int(hdr[H_HOP_DUE]), int(hdr[H_DUE])
        except (KeyError, ValueError):
            unknown = True  # not a wheel record (written by something else): no verdict
            return
        lateness.append(max(0, now - wheel.ready_at(hop_due, due)))

    try:
        await asyncio.wait_for(asyncio.gather(*(one(t, q, at) for (t, q), at in heads.items())),
                               PEEK_BUDGET_S)
    except TimeoutError:
        unknown = True
    if lateness:
        return WheelLag(max(lateness), waiting, len(topics))
    return WheelLag(None if unknown else 0, waiting, len(topics))
