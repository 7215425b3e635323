"""What one access-log line costs: bytes written and CPU of the serving process, per request.

In one process, no network: the gateway's front layer (``gateway.api.access.App``, the same
``Front`` every request passes) around one route, driven through ASGI on an event loop, with the
log setup a node has (``logs.configure``: JSON lines batched by ``LoopBatchedHandler``) writing
to a line-buffered file as stderr is (one write call per batch). Rounds alternate a line for every request
(``access_log_sample=1``) and none (``0``); the difference in process CPU time per request is
the line's cost, and bytes / lines its size. The request looks like a ``GET /message`` from a
client on the network (a 32-digit request id, a client address), so the line is the size such
a line is in a node's log::

    .venv/bin/python bench/access_log.py                  # 9 rounds of 50,000 requests per variant
    .venv/bin/python bench/access_log.py --requests 20000 --rounds 3

CPU time is the process's own (``time.process_time``), so other load on the machine changes it
less than wall time, but caches and frequency are shared: compare rounds, use the median.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

from gateway.api import access  # noqa: E402
from gateway.ops import logs  # noqa: E402


async def message(request: Request) -> Response:
    return Response(b'{"status":"empty","messages":[]}', media_type="application/json")


def scope() -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": "/message", "raw_path": b"/message", "root_path": "",
            "query_string": b"consumer=billing&topic=orders&max=32&wait_ms=0",
            "headers": [(b"host", b"gw:8080"), (b"user-agent", b"python-httpx/0.28.1"),
                        (b"accept", b"*/*")],
            "client": ("10.0.0.7", 51234), "server": ("10.0.0.2", 8080), "state": {}}


async def drive(app: Any, n: int) -> float:
    """CPU seconds of the process for ``n`` requests (and the lines they log, written)."""
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    base = scope()
    t0 = time.process_time()
    for i in range(n):
        await app({**base, "headers": list(base["headers"])}, receive, send)
        if i % 200 == 199:
            await asyncio.sleep(0)  # let the batched log writes run, as between requests
    await asyncio.sleep(0.05)  # the last batch's write
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()

    fd, path = tempfile.mkstemp(prefix="mqgw-access-", suffix=".log")
    apps = {s: access.App([access.route("/message", message, ["GET"])], access_log_sample=s)
            for s in (1.0, 0.0)}
    per_request: dict[float, list[float]] = {1.0: [], 0.0: []}
    line_bytes: list[float] = []
    with open(fd, "w", buffering=1) as sink:  # line-buffered, as sys.stderr
        sys.stderr = sink  # logs.configure's handler writes here
        logs.configure("INFO")

        async def run() -> None:
            await drive(apps[1.0], 2000)  # warm-up
            for _ in range(args.rounds):
                for s, app in apps.items():
                    before = os.fstat(sink.fileno()).st_size
                    cpu = await drive(app, args.requests)
                    per_request[s].append(cpu / args.requests * 1e6)
                    if s == 1.0:
                        line_bytes.append((os.fstat(sink.fileno()).st_size - before) / args.requests)
        try:
            asyncio.run(run())
        finally:
            sys.stderr = sys.__stderr__
            os.unlink(path)

    on, off = per_request[1.0], per_request[0.0]
    diffs = [a - b for a, b in zip(on, off, strict=True)]
    print(f"requests per variant and round: {args.requests:,}, rounds: {args.rounds}")
    print("CPU µs per request, every line  :", " ".join(f"{v:.1f}" for v in on))
    print("CPU µs per request, no line     :", " ".join(f"{v:.1f}" for v in off))
    print(f"a line: {statistics.median(line_bytes):.0f} bytes, "
          f"{statistics.median(diffs):.2f} µs of CPU (median of the rounds' differences; "
          f"range {min(diffs):.2f}-{max(diffs):.2f})")
    for rate in (100, 1000, 2000):
        mb_h = statistics.median(line_bytes) * rate * 3600 / 1e6
        print(f"  at {rate:>5} req/s on a node: {mb_h:,.0f} MB/hour with every line, "
              f"{mb_h / 100:,.1f} MB/hour at access_log_sample=0.01")


if __name__ == "__main__":
    main()
