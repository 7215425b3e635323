"""Async consumer loops used by the end-to-end tests: real HTTP against several nodes."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Tally:
    """What consumers saw: deliveries per message value, and which deliveries were redeliveries."""

    seen: Counter = field(default_factory=Counter)
    first_seen_redelivered: list[str] = field(default_factory=list)
    duplicate_not_redelivered: list[tuple[str, int]] = field(default_factory=list)
    offsets: dict[str, list[int]] = field(default_factory=dict)
    batches: int = 0
    redelivered_batches: int = 0
    dropped_batches: int = 0
    ack_results: Counter = field(default_factory=Counter)
    transport_errors: int = 0

    def record(self, body: dict[str, Any]) -> None:
        self.batches += 1
        redelivered = bool(body["redelivered"])
        self.redelivered_batches += redelivered
        for m in body["messages"]:
            v = m["value"]
            if self.seen[v] and not redelivered:
                self.duplicate_not_redelivered.append((v, m["offset"]))
            self.seen[v] += 1
            self.offsets.setdefault(body["queue"], []).append(m["offset"])


async def call(http: httpx.AsyncClient, urls: list[str], method: str, path: str,
               tally: Tally, **kw: Any) -> httpx.Response:
    """Send to a random node; on a dead node retry elsewhere, as a load balancer would."""
    for _ in range(50):
        try:
            return await http.request(method, random.choice(urls) + path, **kw)
        except httpx.TransportError:
            tally.transport_errors += 1
            await asyncio.sleep(0.05)
    raise RuntimeError("no node answered")


async def consume(urls: list[str], group: str, topic: str, total: int, tally: Tally, *,
                  consumers: int = 10, max_messages: int = 50, client_id: str = "",
                  drop_every: int = 0, deadline_s: float = 120.0, wait_ms: int = 500,
                  piggyback: bool = True) -> None:
    """Run ``consumers`` loops until ``total`` distinct values were seen (or the deadline).

    ``drop_every=N`` makes every Nth batch of a loop vanish without ack (a crashed client).
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s

    async def one(idx: int) -> None:
        pending = ""
        n = 0
        async with httpx.AsyncClient(timeout=30) as http:
            while len(tally.seen) < total and loop.time() < end:
                params: dict[str, Any] = {"consumer": group, "topic": topic, "max": max_messages,
                                          "wait_ms": wait_ms}
                if client_id:
                    params["clientId"] = client_id
                if pending and piggyback:
                    params["requestId"] = pending
                r = await call(http, urls, "GET", "/message", tally, params=params)
                assert r.status_code == 200, r.text
                body = r.json()
                if "ack" in body:
                    tally.ack_results[body["ack"]["result"]] += 1
                pending = ""
                if body["status"] != "ok":
                    continue
                tally.record(body)
                n += 1
                if drop_every and n % drop_every == 0:
                    tally.dropped_batches += 1
                    continue
                if piggyback:
                    pending = body["requestId"]
                else:
                    a = await call(http, urls, "POST", "/ack", tally, json={"requestId": body["requestId"]})
                    tally.ack_results[a.json()["result"]] += 1
            if pending:
                a = await call(http, urls, "POST", "/ack", tally, json={"requestId": pending})
                tally.ack_results[a.json()["result"]] += 1

    await asyncio.gather(*(one(i) for i in range(consumers)))
