"""A process's copy of one topic's watermarks, with the history of what changed in it.

choose.lua keeps, per consumer hash and topic, the version of each node's copy the hash has
absorbed (``n:<source>`` in the topic's index state, prelude ``ix_keys``). A node that knows that
version sends only the queues whose watermarks changed after it: a request whose size does not
grow with the partitions when nothing moved (issue 35; the full list was ~12 bytes a queue, 49 KB
at 4,096). :meth:`MarkLog.changes_since` answers None when the history no longer reaches back
that far, and the node sends every queue (choose.lua's full path), as it does the first time.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Versions of history kept. Each entry is the set of queues one refresh or one fetch response
#: changed; a consumer hash that absorbed a version older than this gets a full request.
HISTORY = 512


class MarkLog:
    """Watermarks ``{queue: (lo, hi)}`` of one topic as this process holds them; ``version``
    grows with every change, and ``source`` names this copy (versions of another copy, or of
    this process before a restart, mean nothing here)."""

    __slots__ = ("_cache", "_log", "queues", "source", "version")

    def __init__(self, queues: dict[str, tuple[int, int]] | None = None) -> None:
        self.source = secrets.token_hex(6)
        self.version = 0
        self.queues: dict[str, tuple[int, int]] = dict(queues or {})
        self._log: deque[tuple[int, frozenset[str]]] = deque(maxlen=HISTORY)
        #: since -> the changes after it, for the current version (many consumers ask the same)
        self._cache: dict[int, dict[str, tuple[int, int]]] = {}

    def update(self, queues: dict[str, tuple[int, int]], changed: Iterable[str]) -> None:
        """Take ``queues`` as the copy; ``changed`` are the queues whose watermarks moved (or
        that are new). Nothing changed, no new version."""
        names = frozenset(changed)
        self.queues = queues
        if names:
            self.version += 1
            self._log.append((self.version, names))
            self._cache.clear()

    def raise_one(self, queue: str, value: tuple[int, int]) -> None:
        """One queue of the copy moved (a fetch response saw a higher watermark): changed in
        place, not copied (copying 4,096 queues per such response cost the node O(partitions)
        per fetch). Whoever holds :attr:`queues` sees the new value: watermarks only move
        forward, so that is never wrong. A queue the copy lacks is not added (:meth:`update`)."""
        if queue not in self.queues:
            return
        self.queues[queue] = value
        self.version += 1
        self._log.append((self.version, frozenset((queue,))))
        self._cache.clear()

    def changes_since(self, since: int) -> dict[str, tuple[int, int]] | None:
        """The queues whose watermarks changed after version ``since``, as they are now; None
        when the history does not reach back to it (send every queue)."""
        if since == self.version:
            return {}
        if since > self.version or not self._log or self._log[0][0] > since + 1:
            return None
        hit = self._cache.get(since)
        if hit is None:
            names: set[str] = set()
            for v, changed in reversed(self._log):
                if v <= since:
                    break
                names |= changed
            hit = self._cache[since] = {q: self.queues[q] for q in names if q in self.queues}
        return hit


@dataclass(slots=True)
class SharedCopy:
    """The watermark copy in Redis (``P:{wm:<topic>}``) as a process last read it: its version
    (None: unversioned, written by a gateway before versions, or never read) and its queues.
    Given back to :meth:`.OffsetStore.read_watermarks`, it is brought up to date with what moved
    since (watermarks.lua), not read whole."""

    version: int | None = None
    queues: dict[str, tuple[int, int]] = field(default_factory=dict)
