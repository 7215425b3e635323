"""Produce the lines of stdin to a topic, one record per line, up to 100 records per request.

    printf 'hello\\nworld\\n' | MQGW_URL=http://127.0.0.1:8080 python producer.py demo

Prints where each record went, one JSON line each (``{"partition": 4, "offset": 0}``, or
``{"error": {...}}`` for a record the broker refused), and exits 1 if any record failed.
Environment: ``MQGW_URL`` (default http://127.0.0.1:8080), ``MQGW_API_KEY`` (sent as a bearer
token), ``MQGW_PRODUCER`` (the producer name, needed when a key is bound to several).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import httpx

URL = os.environ.get("MQGW_URL", "http://127.0.0.1:8080")
BATCH = 100


def produce(http: httpx.Client, topic: str, values: list[str]) -> list[dict[str, Any]]:
    """One request for a batch. A 503 (the gateway could not reach Kafka, or is at its connection
    limit) is retried after its Retry-After: a resend may write a record twice, which an
    at-least-once consumer must tolerate anyway."""
    body: dict[str, Any] = {"topic": topic, "messages": [{"value": v} for v in values]}
    if producer := os.environ.get("MQGW_PRODUCER"):
        body["producer"] = producer
    for _ in range(5):
        r = http.post("/produce", json=body)
        if r.status_code != 503:
            break
        time.sleep(float(r.headers.get("retry-after", "1")))
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
    sys.exit(main(sys.argv[1]))
