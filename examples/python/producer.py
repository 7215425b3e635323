"""Produce the lines of stdin to a topic, one record per line, as they come.

    printf 'hello\\nworld\\n' | MQGW_URL=http://127.0.0.1:8080 python producer.py demo
    tail -f app.log | python producer.py demo

A batch goes out when it holds 100 lines, or ``MQGW_LINGER_MS`` (default 200) after its first
line was read, or when stdin ends; on Ctrl-C (or SIGTERM) the lines read and not yet sent are
sent before it exits (130, or 143). So a pipe that stays open is sent as it flows.

Prints where each record went, one JSON line each (``{"partition": 4, "offset": 0}``, or
``{"error": {...}}`` for a record the broker refused), and exits 1 if any record failed.
Environment: ``MQGW_URL`` (default http://127.0.0.1:8080), ``MQGW_API_KEY`` (sent as a bearer
token), ``MQGW_PRODUCER`` (the producer name, needed when a key is bound to several).

A gateway that cannot be reached (not started yet, restarting, a network error) or answers
``502``/``503``/``504`` is retried until it answers, with capped exponential backoff: 0.5 s,
1 s, 2 s, ... up to 10 s between tries, each wait jittered (a random 50-100 %) so that many
producers do not come back in step; a ``Retry-After`` longer than that is honoured. Each retry
says why on stderr.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import sys
import time
from typing import Any

import httpx

URL = os.environ.get("MQGW_URL", "http://127.0.0.1:8080")
BATCH = 100
LINGER_S = int(os.environ.get("MQGW_LINGER_MS", "200")) / 1000
FIRST_RETRY_S, MAX_RETRY_S = 0.5, 10.0
RETRY_STATUSES = (502, 503, 504)  # a proxy without a node behind it; Kafka unreachable; a timeout


class Lines:
    """stdin's lines as they come, read in this one thread with select(): a signal only sets
    ``stopped`` (the loop then sends what it read), so no line read is ever dropped."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno()
        self.partial = b""
        self.ended = False
        self.stopped = 0  # the signal that asked us to stop

    def stop(self, signum: int, _frame: object) -> None:
        self.stopped = signum

    def read(self, timeout: float) -> list[str]:
        """The whole lines that arrived within ``timeout`` s (at most a short wait: a stop is
        seen within 0.1 s); at the end of stdin, the last line too."""
        if not select.select([self.fd], [], [], min(timeout, 0.1))[0]:
            return []
        chunk = os.read(self.fd, 65536)
        if not chunk:
            self.ended = True
            tail, self.partial = self.partial, b""
            return [tail.decode(errors="replace")] if tail else []
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in lines]


def post(http: httpx.Client, path: str, body: dict[str, Any], lines: Lines) -> httpx.Response:
    """POST until the gateway gives an answer that is not "try again" (module docstring), or a
    stop comes while it is away. A resend may write a record twice (the first try may have been
    written before the connection broke), which an at-least-once consumer must tolerate anyway."""
    backoff = FIRST_RETRY_S
    while True:
        try:
            r = http.post(path, json=body)
        except httpx.TransportError as e:  # refused, reset, timed out, no such host
            wait, why = 0.0, f"gateway unreachable at {URL} ({type(e).__name__}: {e})"
        else:
            if r.status_code not in RETRY_STATUSES:
                return r
            try:
                wait = float(r.headers.get("retry-after", "0"))
            except ValueError:  # an HTTP date: use the backoff
                wait = 0.0
            why = f"gateway answered {r.status_code}"
        wait = max(wait, backoff * random.uniform(0.5, 1.0))
        print(f"producer: {why}; retrying in {wait:.1f} s", file=sys.stderr, flush=True)
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if lines.stopped:
                sys.exit(f"producer: stopped while the gateway was away; "
                         f"{len(body['messages'])} record(s) of this batch not sent")
            time.sleep(min(0.1, end - time.monotonic()))
        backoff = min(backoff * 2, MAX_RETRY_S)


def produce(http: httpx.Client, topic: str, values: list[str], lines: Lines) -> list[dict[str, Any]]:
    """One request for a batch, retried while the gateway is away (:func:`post`)."""
    body: dict[str, Any] = {"topic": topic, "messages": [{"value": v} for v in values]}
    if producer := os.environ.get("MQGW_PRODUCER"):
        body["producer"] = producer
    r = post(http, "/produce", body, lines)
    r.raise_for_status()  # 400 (bad input), 401/403 (key), 404 (unknown topic), 413 (too large)
    results: list[dict[str, Any]] = r.json()["results"]
    return results


def main(topic: str) -> int:
    headers = {"Authorization": f"Bearer {key}"} if (key := os.environ.get("MQGW_API_KEY")) else {}
    failed = 0
    lines = Lines()
    signal.signal(signal.SIGINT, lines.stop)
    signal.signal(signal.SIGTERM, lines.stop)
    with httpx.Client(base_url=URL, headers=headers, timeout=30) as http:
        batch: list[str] = []
        due = 0.0  # when the batch must go: LINGER_S after its first line
        while True:
            done = lines.ended or lines.stopped
            if batch and (done or len(batch) >= BATCH or time.monotonic() >= due):
                for result in produce(http, topic, batch[:BATCH], lines):
                    failed += "error" in result
                    print(json.dumps(result), flush=True)
                batch = batch[BATCH:]
                due = time.monotonic() + LINGER_S
                continue
            if done:
                break
            got = lines.read(max(due - time.monotonic(), 0.0) if batch else 0.1)
            if got and not batch:
                due = time.monotonic() + LINGER_S
            batch += got
    if lines.stopped:
        return 128 + lines.stopped
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: producer.py TOPIC  (records: the lines of stdin)")
    sys.exit(main(sys.argv[1]))
