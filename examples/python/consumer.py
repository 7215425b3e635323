"""A consumer loop: fetch a batch, handle it, ack it with the next fetch.

    MQGW_URL=http://127.0.0.1:8080 python consumer.py orders-svc demo

- Long poll: each fetch waits up to ``MQGW_WAIT_MS`` (default 10000) for records.
- Piggy-backed ack: the requestId of the handled batch rides on the next fetch, so a busy
  consumer makes one call per batch.
- ``429`` (consumer rate limit): wait ``retryAfterMs``; ``503``: wait ``Retry-After`` seconds.
- A handler that raises hands the batch back with ``/unlock``: it is fetched again at once
  (by this or another client) rather than after the lock timeout.
- SIGTERM or Ctrl-C: the current fetch finishes, the handled batch is acked and an unhandled
  one unlocked, and the program exits 0.

Environment: ``MQGW_URL``, ``MQGW_API_KEY`` (sent as a bearer token), ``MQGW_CLIENT_ID``
(broadcast mode: every clientId gets every record), ``MQGW_FAIL_ONCE`` (a value whose first
handling raises, to watch the unlock). Each handled record is printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import httpx

URL = os.environ.get("MQGW_URL", "http://127.0.0.1:8080")
WAIT_MS = int(os.environ.get("MQGW_WAIT_MS", "10000"))
FAIL_ONCE = os.environ.get("MQGW_FAIL_ONCE")

stopping = False
failed_once: set[str] = set()


def stop(signum: int, frame: FrameType | None) -> None:
    global stopping
    stopping = True


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def handle(queue: str, message: dict[str, Any]) -> None:
    """The application's work. Delivery is at-least-once, so this must tolerate a record twice."""
    value = message["value"]
    if FAIL_ONCE is not None and value == FAIL_ONCE and value not in failed_once:
        failed_once.add(value)
        raise RuntimeError(f"cannot handle {value!r} (MQGW_FAIL_ONCE)")
    print(json.dumps({"queue": queue, "offset": message["offset"], "key": message["key"],
                      "value": value}), flush=True)


def unlock(http: httpx.Client, request_id: str) -> None:
    """Hand a batch back. If this fails, the lock simply expires after its timeout."""
    try:
        http.post("/unlock", json={"requestId": request_id})
    except httpx.HTTPError as e:
        log(f"unlock failed ({e}); the batch comes back after the lock timeout")


def main(consumer: str, topic: str) -> int:
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    headers = {"Authorization": f"Bearer {key}"} if (key := os.environ.get("MQGW_API_KEY")) else {}
    params: dict[str, Any] = {"consumer": consumer, "topic": topic, "wait_ms": WAIT_MS}
    if client_id := os.environ.get("MQGW_CLIENT_ID"):
        params["clientId"] = client_id
    pending = ""  # requestId of the handled batch, acked by the next fetch
    with httpx.Client(base_url=URL, headers=headers, timeout=WAIT_MS / 1000 + 30) as http:
        while not stopping:
            try:
                r = http.get("/message", params={**params, "requestId": pending} if pending else params)
            except httpx.TransportError as e:
                log(f"gateway unreachable ({e}); retrying in 1 s")
                time.sleep(1)
                continue
            if r.status_code == 503:  # the ack may not have run: keep it pending
                time.sleep(float(r.headers.get("retry-after", "1")))
                continue
            if r.status_code not in (200, 429):
                log(f"{r.status_code} {r.text}")
                return 1
            body = r.json()
            pending = ""  # the piggy-backed ack ran, whatever came back
            ack = body.get("ack")
            if ack and ack["result"] not in ("committed", "already_committed"):
                log(f"ack: {ack['result']}: the batch will be redelivered")
            if r.status_code == 429:
                time.sleep(body["retryAfterMs"] / 1000)
                continue
            if body["status"] == "paused":  # answered at once, not long-polled
                time.sleep(1)
                continue
            if body["status"] != "ok":  # empty: the long poll ran out
                continue
            if stopping:  # fetched but not handled: let another client have it now
                unlock(http, body["requestId"])
                break
            try:
                for message in body["messages"]:
                    handle(body["queue"], message)
            except Exception as e:  # noqa: BLE001 - any handler failure hands the batch back
                log(f"handler failed ({e}); batch unlocked")
                unlock(http, body["requestId"])
                continue
            pending = body["requestId"]
        if pending:
            http.post("/ack", json={"requestId": pending})
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: consumer.py CONSUMER TOPIC")
    sys.exit(main(sys.argv[1], sys.argv[2]))
