"""Kafka's offset rules over a raw read (:class:`.fetch.RawRead`): retention, holes, and the
re-check that tells a hole from a fetch racing a producer at the tail.

Offsets missing at the start of a read (records begin above the offset asked for, or there are
no records but the log ends above it) are final on Apache Kafka: below the high watermark (and,
read committed, the last stable offset) they are compaction, transaction markers or aborted
records. So by default (``gap_recheck_ms`` 0) a hole is reported as skipped and a batch runs
across holes inside it. A broker whose fetch can race a producer at the tail and skip records
that become readable a moment later (Tansu) is read with ``gap_recheck_ms`` > 0: a hole is then
accepted only after one more look, and a hole *inside* a batch ends the batch before it
(:func:`.fetch.read`), so the next read starts at the hole and checks it the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..base import FetchResult, Skipped, SkipReason
from .fetch import RawRead


async def read_checked(read: Callable[[int], Awaitable[RawRead]], offset: int,
                       recheck_s: float) -> FetchResult:
    """The port's FetchResult of ``read(offset)``, holes looked at again after ``recheck_s``
    (0: holes are trusted at once)."""
    res = await read(offset)
    if res.out_of_range and res.low_watermark > offset:
        res2 = await read(res.low_watermark)
        return _result(res2, res.low_watermark,
                       Skipped(offset, res.low_watermark, SkipReason.OUT_OF_RETENTION))
    first = _first_offset(res)
    if first > offset and recheck_s > 0:  # a broker that may race at the tail: look again
        await asyncio.sleep(recheck_s)
        res = await read(offset)
        first = _first_offset(res)
    if first > offset:
        reason = SkipReason.GAP if res.records else SkipReason.NO_RECORDS
        return _result(res, first, Skipped(offset, first, reason))
    return _result(res, offset, None)


def _result(res: RawRead, start: int, skipped: Skipped | None) -> FetchResult:
    nxt = res.records[-1].offset + 1 if res.records else start
    return FetchResult(res.records, nxt, res.high_watermark, skipped)


def _first_offset(res: RawRead) -> int:
    """Where readable data starts in a raw read, -1 if it says nothing."""
    return res.records[0].offset if res.records else res.end_offset
