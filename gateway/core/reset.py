"""Offset resets: an operator moves a consumer's committed offsets.

A reset rewrites committed offsets in one script call per consumer key and takes effect on
every node at once, invalidating batches fetched before it (their acks answer
``offset_reset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..broker import Broker
from ..store import OffsetStore
from .checkpoint import Checkpoints
from .errors import invalid, unknown
from .names import check_name, check_topic
from .registry import topics_refused

RESET_MODES = ("earliest", "latest", "timestamp", "offset")


@dataclass(frozen=True, slots=True)
class ResetRequest:
    """An operator's reset as given, not yet checked (:func:`reset` checks it, in a fixed order,
    so the first problem reported is the same whatever the front end)."""

    topic: Any = None
    to: Any = None
    timestamp: Any = None
    offset: Any = None
    queue: Any = None
    client_id: Any = None  # None: cluster offsets; "*": every broadcast clientId
    dry_run: Any = False  # True: say what would move, move nothing


@dataclass(frozen=True, slots=True)
class MovedQueue:
    client_id: str | None
    queue: str
    before: int | None  # None: the queue had no committed offset yet
    after: int


@dataclass(frozen=True, slots=True)
class ResetResult:
    consumer: str
    topic: str
    to: str
    queues: list[MovedQueue]
    dry_run: bool = False  # nothing was moved: ``queues`` say what a reset would do now

    @property
    def moved(self) -> int:
        return sum(1 for m in self.queues if m.before != m.after)


async def reset(store: OffsetStore, broker: Broker, consumer: str, req: ResetRequest,
                cfg: dict[str, str], client_idle_ms: int = 7 * 86_400_000,
                checkpoints: Checkpoints | None = None) -> ResetResult:
    """Move one consumer's committed offsets on a topic; see docs/api.md, Reset offsets.

    ``cfg`` is the consumer's config (``Registry.require_known``, which refuses unknown names
    outside open mode). A registered consumer is reset only on its registered topics: a typo in
    the topic must fail rather than create offsets nobody reads."""
    topic = check_topic(req.topic)
    if not isinstance(req.dry_run, bool):
        raise invalid("invalid_dry_run", "dryRun must be true or false")
    client = req.client_id
    if client is not None and client != "*":
        client = check_name(client, "clientId")
    registered = cfg.get("registered") == "1"
    if topics_refused(cfg, [topic]):
        raise invalid("topic_not_allowed", f"consumer {consumer!r} is not registered for topic {topic!r}")
    mode = req.to
    if mode not in RESET_MODES:
        raise invalid("invalid_to", f"to must be one of {', '.join(RESET_MODES)}")
    queue = req.queue
    if queue is not None and (isinstance(queue, bool) or not isinstance(queue, (str, int))):
        raise invalid("invalid_queue", "queue must be a queue id such as \"0\"")
    wm = await broker.watermarks(topic)  # fresh from the broker: resets are rare, get them right
    queues = list(wm)
    if queue is not None:
        if str(queue) not in wm:
            raise unknown("unknown_queue", f"topic {topic!r} has no queue {queue!r}")
        queues = [str(queue)]
    targets: dict[str, int] = {}
    if mode == "earliest":
        targets = {q: wm[q][0] for q in queues}
    elif mode == "latest":
        targets = {q: wm[q][1] for q in queues}
    elif mode == "timestamp":
        ts = req.timestamp
        if type(ts) is not int or not 0 <= ts <= 2**63 - 1:
            raise invalid("invalid_timestamp", "timestamp must be ms since the epoch")
        targets = {q: await broker.offset_for_time(topic, q, ts) for q in queues}
    else:
        off = req.offset
        if queue is None:
            raise invalid("queue_required", "an explicit offset needs a queue")
        if type(off) is not int:
            raise invalid("invalid_offset", "offset must be an integer")
        lo, hi = wm[str(queue)]
        if not lo <= off <= hi:
            raise invalid("offset_out_of_range", f"offset must be between {lo} and {hi}",
                          min=lo, max=hi)
        targets = {str(queue): off}
    if registered:  # a hash of the other mode is one no reader ever uses
        if cfg.get("mode") == "cluster" and client:
            raise invalid("client_id_not_allowed",
                          f"consumer {consumer!r} is registered in cluster mode: leave out clientId")
        if cfg.get("mode") == "broadcast" and not client:
            raise invalid("client_id_required", f"consumer {consumer!r} is registered in broadcast "
                          "mode: give a clientId, or '*' for all of them")
    if client == "*":
        clients = [c for c, _ in await store.clients(consumer)]
    else:
        clients = [client] if client else [""]
    moved: list[MovedQueue] = []
    if req.dry_run:  # the same checks and targets, then what each queue holds now
        for c in clients:
            now = {s.queue: s.committed for s in await store.queue_states(consumer, c)
                   if s.topic == topic and s.has_offset}
            moved += [MovedQueue(c or None, q, now.get(q), new) for q, new in targets.items()]
        return ResetResult(consumer, topic, mode, moved, dry_run=True)
    for c in clients:  # a clientId's offsets expire when idle; one the reset creates must too
        for q, old, new in await store.reset(consumer, c, topic, targets, client_idle_ms=client_idle_ms):
            moved.append(MovedQueue(c or None, q, old if old >= 0 else None, new))
    if checkpoints is not None and clients == [""]:  # so that a later restore does not undo it
        await checkpoints.save_now(consumer, topic, targets)
    return ResetResult(consumer, topic, mode, moved)
