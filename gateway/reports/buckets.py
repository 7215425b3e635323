"""Time buckets of the heat map: which cells have a sample, and which are a real gap.

Buckets are as wide as the sample interval (or wider on a long window) and anchored at the first
sample, so a snapshotter's jitter of a few milliseconds moves a sample across a bucket boundary:
one bucket gets two samples, its neighbour none. Showing that neighbour as "no sample" would be
a lie (the snapshots never stopped), so an empty bucket holds the previous sample's lag when the
gap from the previous sample to the next one is short (at most :data:`GAP_FACTOR` sample
intervals); only a longer gap, where snapshots really stopped, stays empty (grey).

Pure Python (no Spark, no matplotlib), so the rule is tested on its own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

#: An empty bucket is a gap only when no sample came for more than this many sample intervals.
#: 1.5: a jitter of up to half an interval either way never shows a gap; one missed sample does.
GAP_FACTOR = 1.5


def max_gap_ms(interval_ms: float) -> float:
    """The longest time between two samples that still counts as continuous sampling."""
    return GAP_FACTOR * interval_ms


def grid(points: Iterable[tuple[int, int, float]], start_ms: int, bucket_ms: int, cols: int,
         max_gap: float) -> list[float]:
    """``(first_ms, last_ms, lag)`` per bucket (as :func:`lag._bucketed` returns them; several
    per bucket are merged) -> one value per bucket: the highest lag, the held lag of the previous
    sample across a short gap, or NaN where no sample came for longer than ``max_gap`` ms."""
    row = [math.nan] * cols
    first = [0] * cols
    last = [0] * cols
    for t0, t1, v in points:
        i = (t0 - start_ms) // bucket_ms
        if not 0 <= i < cols:
            continue
        if math.isnan(row[i]):
            row[i], first[i], last[i] = v, t0, t1
        else:
            row[i], first[i], last[i] = max(row[i], v), min(first[i], t0), max(last[i], t1)
    filled = [i for i in range(cols) if not math.isnan(row[i])]
    for a, b in itertools.pairwise(filled):
        if b > a + 1 and first[b] - last[a] <= max_gap:
            for i in range(a + 1, b):
                row[i] = row[a]  # the lag did not change that we know of: hold it
    return row


def empty_columns(rows: Sequence[Sequence[float]]) -> list[int]:
    """Columns in which no row has a value: times at which no queue shown was sampled."""
    if not rows:
        return []
    return [c for c in range(len(rows[0])) if all(math.isnan(r[c]) for r in rows)]
