"""The cyclic garbage collector's settings for a long-running gateway process (a ``mqgw serve``
worker, ``mqgw relay``).

CPython runs a generation-0 collection every 700 net allocations of GC-tracked objects (dicts,
lists, class instances). A ``/message?max=1000`` answer makes several per record (librdkafka's
Message, the Record, the answer's dict), so a worker collected about a dozen times per batch and
moved every record of the batches in flight into the older generations, whose collections walk
them again (and the full ones the whole heap). In the f1000 phase ``perf`` put ~18 % of all
samples (about a quarter of the workers') in the collector. Measured (BENCHMARKS.md, issue 23)
with bench/record_cpu.py (a max=1000 read after a 1,000-record skip, then the JSON answer): 4.1-4.7
us of CPU a record before, 1.8-2.6 with these settings and a record's empty headers no longer a
new list each; in ``make bench``, f1000 went from 73,000-100,000 to 116,000-137,000 records/s
(three alternating runs each). Thresholds of 10,000 and 50,000 measured alike.

These objects die by reference counting as soon as their answer is written; the collector is
only for cycles, which the gateway makes rarely. So the generation-0 threshold is raised (cyclic
garbage waits a little longer; a few MB at most) and what the process built at start-up (modules,
settings, the app) is frozen out of the collector's walks (``gc.freeze``).
"""

from __future__ import annotations

import gc

#: Net allocations of GC-tracked objects between generation-0 collections (CPython's: 700).
GEN0_THRESHOLD = 50_000


def tune_for_serving() -> None:
    """Apply the settings above to this process; call it once, after the start-up imports."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
