"""CPU per record of the max=1000 fetch path's Python part, in one process, without a broker.

What it runs per batch is what a worker runs per ``/message?max=1000`` on Kafka once librdkafka
holds the messages: the Kafka adapter's ``read`` (gateway/broker/kafka/fetch.py) on a pooled
consumer that first skips ``--skip`` records (the batch another worker served: with 2 workers a
pooled consumer skips about every other batch of its partition), then ``fetched_body``
(``encode_records``) and orjson. The consumer is a stand-in whose ``consume`` hands out real
``confluent_kafka.Message`` objects (the type librdkafka's returns; GC-tracked, like the Record
and the answer's dicts), made per batch as librdkafka makes them. Eight answers stay alive at a
time, as eight requests of a worker do in the f1000 phase (16 connections, 2 workers).

CPU time (``time.process_time``) without the making of the messages (Python builds them here,
librdkafka in C there), the fastest of ``--rounds`` rounds, so that a busy shared
machine slows it less than a throughput phase; still: compare variants in one run, alternating.

    .venv/bin/python bench/record_cpu.py                  # the gateway's GC settings
    .venv/bin/python bench/record_cpu.py --gc python      # CPython's defaults, for comparison
    .venv/bin/python bench/record_cpu.py --gateway-src DIR  # another copy of the package
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections import deque
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway-src", default=None, help="serve the gateway package found in DIR")
    ap.add_argument("--gc", choices=("gateway", "python"), default="gateway",
                    help="gateway: the settings the gateway's processes apply (gateway/ops/gc_tuning.py"
                         " where it exists); python: CPython's defaults")
    ap.add_argument("--threshold", type=int, default=0,
                    help="set the GC's generation-0 threshold to this (an experiment)")
    ap.add_argument("--freeze", action="store_true", help="gc.freeze() after the imports")
    ap.add_argument("--batches", type=int, default=400, help="batches per round (400)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the fastest counts (5)")
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--skip", type=int, default=1000,
                    help="records the pooled consumer skips before each batch (1000)")
    args = ap.parse_args()
    if args.gateway_src:
        sys.path.insert(0, args.gateway_src)
    import orjson
    from confluent_kafka import Message

    import gateway.api.app  # noqa: F401  (the modules a worker holds: the heap the full GC walks)
    from gateway.api.consume_wire import fetched_body
    from gateway.broker.base import FetchResult  # noqa: F401
    from gateway.broker.kafka.fetch import PooledConsumer, read
    from gateway.core.fetch import Fetched, FetchStatus
    from gateway.store import now_ms

    if args.gc == "gateway":
        try:
            from gateway.ops import gc_tuning  # type: ignore[attr-defined,unused-ignore]
            gc_tuning.tune_for_serving()
        except ImportError:  # a tree from before issue 23 (--gateway-src): CPython's defaults
            args.gc = "python (that tree has no gateway/ops/gc_tuning.py)"
    if args.freeze:
        gc.collect()
        gc.freeze()
    if args.threshold:
        gc.set_threshold(args.threshold, *gc.get_threshold()[1:])
    value = b"x" * args.value_size
    ts = now_ms()

    per = args.skip + 1000

    class Held:
        """A consumer holding ``msgs`` at its position: what librdkafka's has prefetched."""

        def __init__(self) -> None:
            self.msgs: list[Any] = []

        def consume(self, n: int, timeout: float) -> list[Any]:
            out, self.msgs = self.msgs[:n], self.msgs[n:]
            return out

        def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
            return 0, 1 << 40

    held = Held()
    pc = PooledConsumer(held)  # type: ignore[arg-type]
    pc.topic, pc.partition, pc.position = "bench", 0, 0

    making = [0.0]  # CPU spent making the messages (librdkafka's part, in C there): left out

    def batch(b: int) -> list[Any]:
        base = b * per
        t = time.process_time()
        held.msgs = [Message(topic="bench", partition=0, offset=base + i, key=None, value=value,
                             timestamp=(1, ts)) for i in range(per)]
        making[0] += time.process_time() - t
        pc.position = base
        return read(pc, "bench", 0, base + args.skip, 1000, blocking=False).records

    batch_type = _batch_type()
    alive: deque[bytes] = deque(maxlen=8)
    best = float("inf")
    for _ in range(args.rounds):
        counts = [s["collections"] for s in gc.get_stats()]
        making[0] = 0.0
        t0 = time.process_time()
        for b in range(args.batches):
            records = batch(b)
            assert len(records) == 1000
            f = Fetched(FetchStatus.OK, "bench", batch_type(records), None)  # type: ignore[call-arg]
            alive.append(orjson.dumps(fetched_body(f, "kafka", "utf8")))
            del records, f
        took = time.process_time() - t0 - making[0]
        after = [s["collections"] for s in gc.get_stats()]
        best = min(best, took)
        print(f"  {took / args.batches / 1000 * 1e6:6.2f} us/record  "
              f"gc collections gen0/1/2: {'/'.join(str(a - c) for a, c in zip(after, counts, strict=True))}",
              flush=True)
    print(f"best {best / args.batches / 1000 * 1e6:.2f} us/record ({args.gc} GC settings)")
    return 0


def _batch_type() -> Any:
    """A stand-in for the core's Batch with the fields ``fetched_body`` reads."""
    from dataclasses import dataclass, field

    @dataclass
    class B:
        records: list[Any]
        request_id: str = "r" * 40
        topic: str = "bench"
        queue: str = "0"
        offset: int = 0
        next_offset: int = 1000
        backlog: int = 5000
        redelivered: bool = False
        lock_timeout_ms: int = 30000
        skipped: Any = None
        extra: dict[str, Any] = field(default_factory=dict)
    return B


if __name__ == "__main__":
    raise SystemExit(main())
