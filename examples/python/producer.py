"""Produce the lines of stdin to a topic, one record per line, up to 100 records per request.

    printf 'hello\\nworld\\n' | MQGW_URL=http://127.0.0.1:8080 python producer.py demo

Prints where each record went, one JSON line each (``{"partition": 4, "offset": 0}``, or
``{"error": {...}}`` for a record the broker refused), and exits 1 if any record failed.
Environment: ``MQGW_URL`` (default http://127.0.0.1:8080), ``MQGW_API_KEY`` (sent as a bearer
token), ``MQGW_PRODUCER`` (the producer name, needed when a key is bound to several).

A gateway that cannot be reached (not started yet, restarting, a network error) or answers
``502``/``503``/``504`` is retried until it answers, with capped exponential backoff: 0.5 s,
1 s, 2 s, ... up to 10 s between tries, each wait jittered (a random 50-100 %) so that many
producers do not come back in step; a ``Retry-After`` longer than that is honoured. Each retry
says why on stderr. Stop it with Ctrl-C.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import httpx

URL = os.environ.get("MQGW_URL", "http://127.0.0.1:8080")
BATCH = 100
FIRST_RETRY_S, MAX_RETRY_S = 0.5, 10.0
RETRY_STATUSES = (502, 503, 504)  # a proxy without a node behind it; Kafka unreachable; a timeout


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """POST until the gateway gives an answer that is not "try again" (module docstring). A
    resend may write a record twice (the first try may have been written before the connection
    broke), which an at-least-once consumer must tolerate anyway."""
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
        time.sleep(wait)
        backoff = min(backoff * 2, MAX_RETRY_S)


def produce(http: httpx.Client, topic: str, values: list[str]) -> list[dict[str, Any]]:
    """One request for a batch, retried while the gateway is away (:func:`post`)."""
    body: dict[str, Any] = {"topic": topic, "messages": [{"value": v} for v in values]}
    if producer := os.environ.get("MQGW_PRODUCER"):
        body["producer"] = producer
    r = post(http, "/produce", body)
    r.raise_for_status()  # 400 (bad input), 401/403 (key), 404 (unknown topic), 413 (too large)
    results: list[dict[str, Any]] = r.json()["results"]
    return results


def main(topic: str) -> int:
    headers = {"Authorization": f"Bearer {key}"} if (key := os.environ.get("MQGW_API_KEY")) else {}
    failed = 0
    with httpx.Client(base_url=URL, headers=headers, timeout=30) as http:
        lines = [line.rstrip("\n") for line in sys.stdin]
        for i in range(0, len(lines), BATCH):
            for result in produce(http, topic, lines[i:i + BATCH]):
                failed += "error" in result
                print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: producer.py TOPIC  (records: the lines of stdin)")
    try:
        sys.exit(main(sys.argv[1]))
    except KeyboardInterrupt:  # Ctrl-C, e.g. while waiting for the gateway
        sys.exit(130)
