"""Retries with a delay per attempt, dead letters and redrive (issue 12).

Real redis-server, the real broker, two gateway nodes relaying the wheel; each request goes to
the other node than the one before, so nothing a node remembers can carry the test. Each test
gives its nodes level, retry and dead-letter topics of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import Settings
from gateway.core.retry import RetryPolicy, retry_topic

from .helpers import Node, start_node, unique
from .test_delay import LEVELS


def _nodes(redis_url: str, bootstrap: str, tmp: Path, n: int = 2) -> list[Node]:
    tag = unique("rt")
    settings = {"relay": "true", "delay_levels": LEVELS, "delay_topic_prefix": f"{tag}.d.",
                "delay_partitions": 2, "relay_lock_ms": 2000, "retry_topic_prefix": f"{tag}.r.",
                "dead_letter_prefix": f"{tag}.dead.", "retry_partitions": 2}
    return [start_node(redis_url, bootstrap, tmp, **settings) for _ in range(n)]


class Client:
    """Round-robin over the nodes, as a load balancer would."""

    def __init__(self, nodes: list[Node]) -> None:
        self.urls = [n.url for n in nodes]
        self.i = 0
        self.http = httpx.Client(timeout=30)

    def url(self) -> str:
        self.i += 1
        return self.urls[self.i % len(self.urls)]

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(self.url() + path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.post(self.url() + path, **kw)

    def patch(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.patch(self.url() + path, **kw)

    def put(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.put(self.url() + path, **kw)

    def fetch(self, topic: str, group: str, want: int, timeout_s: float = 60,
              **params: Any) -> dict[str, Any]:
        """Poll until ``want`` records came, in one batch or several (records of one attempt
        may sit in several queues of the retry topic); the batches stay locked. Returns the
        records and the batches' ``requestIds`` (the first batch's other fields too)."""
        deadline = time.monotonic() + timeout_s
        out: dict[str, Any] = {"messages": [], "requestIds": []}
        while time.monotonic() < deadline and len(out["messages"]) < want:
            r = self.get("/message", params={"topic": topic, "consumer": group, "max": 100,
                                             "wait_ms": 1000, **params})
            assert r.status_code == 200, r.text
            body = r.json()
            if body["messages"]:
                out = {**body, **out}
                out["messages"] = out["messages"] + body["messages"]
                out["requestIds"].append(body["requestId"])
                out["retried"] = out.get("retried", True) and "retryTopic" in body
        assert len(out["messages"]) >= want, f"{out} within {timeout_s} s"
        return out

    def each(self, path: str, body: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
        """POST ``path`` for every batch of a :meth:`fetch`; the answers."""
        out = []
        for rid in body["requestIds"]:
            r = self.post(path, json={"requestId": rid, **extra})
            assert r.status_code == 200, r.text
            out.append(r.json())
        return out

    def close(self) -> None:
        self.http.close()


def _cli(node: Node, *args: str) -> Any:
    """``mqgw admin`` against ``node``: its JSON answer."""
    p = subprocess.run([sys.executable, "-m", "gateway", "admin", "--url", node.url, *args],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _headers(m: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in m["headers"]}


def test_policy_arithmetic() -> None:
    s = Settings()
    p = RetryPolicy.of("g", {"retry_delays_ms": "10000,30000,60000"}, s)
    assert p.max_attempts == 4 and [p.delay_before(a) for a in (2, 3, 4, 5)] == \
        [10000, 30000, 60000, 60000]
    p = RetryPolicy.of("g", {"retry_initial_delay_ms": "100", "retry_multiplier": "3",
                             "retry_max_delay_ms": "2000", "retry_max_attempts": "1000"}, s)
    assert [p.delay_before(a) for a in (2, 3, 4, 5, 1000)] == [100, 300, 900, 2000, 2000]
    assert p.dead_letter_topic == "mqgw.dead.g"
    d = RetryPolicy.of("g", {}, s)
    assert (d.max_attempts, d.delay_before(2), d.delay_before(3)) == (5, 1000, 2000)
    # names: readable, unique although names contain dots, within Kafka's 249 characters
    assert retry_topic("p.", "a.b", "c") != retry_topic("p.", "a", "b.c")
    assert retry_topic("p.", "g", "t", "c1") != retry_topic("p.", "g", "t", "c2")
    assert retry_topic("p.", "orders-svc", "orders").startswith("p.orders-svc.orders.")
    assert len(retry_topic("mqgw.retry.", "g" * 200, "t" * 249, "c" * 200)) == 249


def test_retry_schedule_then_dead_letters_then_redrive(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(1)
    nodes = _nodes(redis_url, bootstrap, tmp_path)
    c = Client(nodes)
    group = unique("sched")
    delays = [300, 700, 1200]
    try:
        out = _cli(nodes[0], "consumers", "set", group, "--retry-delays-ms", "300,700,1200")
        assert out["retry"] == {"delaysMs": delays}
        assert c.get("/message", params={"topic": topic, "consumer": group}).status_code == 200
        r = c.post("/produce", json={"topic": topic, "messages": [
            {"value": v, "key": v, "headers": {"trace": v}} for v in "abc"]})
        assert r.status_code == 200, r.text
        lateness = []
        due = 0
        for attempt in range(1, 5):
            body = c.fetch(topic, group, 3)
            arrived = int(time.time() * 1000)
            assert sorted(m["value"] for m in body["messages"]) == ["a", "b", "c"]
            assert {m["attempt"] for m in body["messages"]} == {attempt}
            if attempt > 1:
                assert arrived >= due, "a retry came before its due time"
                lateness.append(arrived - due)
                assert group in body["retryTopic"]
                h = _headers(body["messages"][0])
                assert h["mqgw-attempt"] == str(attempt) and h["mqgw-origin-topic"] == topic
                assert h["trace"] == body["messages"][0]["value"]  # the record's own headers
                assert int(h["mqgw-first-delivery-ms"]) <= int(h["mqgw-last-failure-ms"])
            else:
                assert "retryTopic" not in body
            sent = int(time.time() * 1000)
            answers = c.each("/nack", body)
            assert {a["result"] for a in answers} == {"committed"}
            out = {"retried": [x for a in answers for x in a["retried"]],
                   "deadLettered": [x for a in answers for x in a["deadLettered"]],
                   "deadLetterTopic": answers[0]["deadLetterTopic"]}
            if attempt < 4:
                assert [x["attempt"] for x in out["retried"]] == [attempt + 1] * 3
                assert out["deadLettered"] == []
                due = max(x["deliverAt"] for x in out["retried"])
                assert due >= sent + delays[attempt - 1]  # the schedule, attempt by attempt
            else:  # the last attempt: to the dead-letter topic
                assert out["retried"] == [] and len(out["deadLettered"]) == 3
                assert out["deadLetterTopic"].endswith(group)
        print(f"retry lateness after {delays} ms: {lateness} ms")
        assert max(lateness) < 8000  # measured: about 100-300 ms (BENCHMARKS.md)

        # nothing else comes: the attempts are used up
        r = c.get("/message", params={"topic": topic, "consumer": group, "wait_ms": 1500})
        assert r.json()["messages"] == [], r.text

        # the dead letters, listed
        r = c.get(f"/admin/consumers/{group}/dead-letters")
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["count"] == 3 and page["exists"] and page["oldestMs"] > 0, str(page)
        assert sorted(m["value"] for m in page["messages"]) == ["a", "b", "c"]
        assert {m["attempt"] for m in page["messages"]} == {4}
        page = _cli(nodes[1], "dead-letters", group, "--limit", "1")
        assert len(page["messages"]) == 1 and page["count"] == 3

        # redriven: one, then the rest; they come back to this consumer as attempt 1
        assert _cli(nodes[0], "redrive", group, "--limit", "1")["redriven"] == 1
        assert c.get(f"/admin/consumers/{group}/dead-letters").json()["count"] == 2
        r = c.post(f"/admin/consumers/{group}/dead-letters/redrive", json={})
        assert r.status_code == 200 and r.json()["redriven"] == 2, r.text
        assert c.get(f"/admin/consumers/{group}/dead-letters").json()["count"] == 0
        r = c.post(f"/admin/consumers/{group}/dead-letters/redrive", json={})
        assert r.json()["redriven"] == 0  # nothing twice
        body = c.fetch(topic, group, 3)
        assert sorted(m["value"] for m in body["messages"]) == ["a", "b", "c"]
        assert {m["attempt"] for m in body["messages"]} == {1}
        assert {a["result"] for a in c.each("/ack", body)} == {"committed"}
    finally:
        c.close()
        for n in nodes:
            n.stop()


def test_partial_failures_broadcast_clients_and_redrive_to_the_topic(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(1)
    nodes = _nodes(redis_url, bootstrap, tmp_path)
    c = Client(nodes)
    group = unique("bc")
    try:
        r = c.put(f"/admin/consumers/{group}", json={
            "topics": [topic], "mode": "broadcast", "start": "earliest",
            "retry": {"delaysMs": [200], "maxAttempts": 2}})
        assert r.status_code == 201, r.text
        r = c.post("/produce", json={"topic": topic, "messages": [{"value": f"m{i}"} for i in range(4)]})
        assert r.status_code == 200, r.text
        a = c.fetch(topic, group, 4, clientId="A")
        b = c.fetch(topic, group, 4, clientId="B")
        offs = [m["offset"] for m in a["messages"]]
        sent = int(time.time() * 1000)
        r = c.post("/ack", json={"requestId": a["requestIds"][0],
                                 "failed": [offs[1], {"offset": offs[3], "delayMs": 600}]})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["result"] == "committed" and out["committedOffset"] == offs[3] + 1
        by = {x["offset"]: x for x in out["retried"]}
        assert set(by) == {offs[1], offs[3]} and {x["attempt"] for x in by.values()} == {2}
        assert by[offs[1]]["deliverAt"] >= sent + 200 and by[offs[3]]["deliverAt"] >= sent + 600
        assert c.each("/ack", b)[0]["result"] == "committed"
        got = c.fetch(topic, group, 2, clientId="A")
        assert sorted(m["value"] for m in got["messages"]) == ["m1", "m3"]
        assert {m["attempt"] for m in got["messages"]} == {2}
        assert _headers(got["messages"][0])["mqgw-client-id"] == "A"
        # B failed nothing: no retry of A's reaches it
        r = c.get("/message", params={"topic": topic, "consumer": group, "clientId": "B",
                                      "wait_ms": 1500})
        assert r.json()["messages"] == [], r.text
        # attempt 2 of 2 fails: dead letters, redriven to the topic itself (every reader)
        assert sum(len(a["deadLettered"]) for a in c.each("/nack", got)) == 2
        r = c.post(f"/admin/consumers/{group}/dead-letters/redrive", json={"target": "topic"})
        assert r.json() == {"consumer": group, "deadLetterTopic": r.json()["deadLetterTopic"],
                            "target": "topic", "redriven": 2}, r.text
        for client in ("A", "B"):
            back = c.fetch(topic, group, 2, clientId=client)
            assert sorted(m["value"] for m in back["messages"]) == ["m1", "m3"]
            assert not back["retried"] and {m["attempt"] for m in back["messages"]} == {1}
            assert not any(k.startswith("mqgw-") for m in back["messages"] for k, _ in m["headers"])
    finally:
        c.close()
        for n in nodes:
            n.stop()


def test_bad_nacks_are_refused_and_write_nothing(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = make_topic(1)
    nodes = _nodes(redis_url, bootstrap, tmp_path, 1)
    c = Client(nodes)
    group = unique("bad")
    try:
        assert c.get("/message", params={"topic": topic, "consumer": group}).status_code == 200
        c.post("/produce", json={"topic": topic, "messages": [{"value": "x"}, {"value": "y"}]})
        body = c.fetch(topic, group, 2)
        rid, = body["requestIds"]
        end = body["nextOffset"]
        for payload, code in [({"requestId": rid, "failed": [end]}, "invalid_failed"),
                              ({"requestId": rid, "failed": "all"}, "invalid_failed"),
                              ({"requestId": rid, "failed": [{"offset": 0, "why": 1}]},
                               "invalid_failed"),
                              ({"requestId": rid, "delayMs": -1}, "invalid_delay"),
                              ({"requestId": rid, "delayMs": "soon"}, "invalid_delay"),
                              ({"requestId": rid, "later": 1}, "unknown_parameter"),
                              ({}, "missing_request_id"),
                              ({"requestId": "garbage"}, "invalid_request_id")]:
            r = c.post("/nack", json=payload)
            assert r.status_code == 400 and r.json()["error"]["code"] == code, (payload, r.text)
        assert c.post("/ack", json={"requestId": rid}).json()["result"] == "committed"
        r = c.post("/nack", json={"requestId": rid})  # after the ack: nothing to fail
        assert r.status_code == 200 and r.json()["result"] == "already_committed", r.text
        assert "retried" not in r.json()
        r = c.get("/message", params={"topic": topic, "consumer": group, "wait_ms": 1000})
        assert r.json()["messages"] == []
        r = c.post(f"/admin/consumers/{group}/dead-letters/redrive", json={"target": "elsewhere"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_target", r.text
        r = c.get(f"/admin/consumers/{group}/dead-letters", params={"limit": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_limit", r.text
        r = c.get(f"/admin/consumers/{group}/dead-letters")
        assert r.status_code == 200 and r.json()["count"] == 0 and not r.json()["exists"], r.text
    finally:
        c.close()
        for n in nodes:
            n.stop()


@pytest.mark.parametrize("retry", [{"delaysMs": []}, {"delaysMs": [-1]}, {"delaysMs": "1s"}])
def test_bad_schedules_are_refused(retry: dict[str, Any], api: Any) -> None:
    r = api.http.patch(api.url(f"/admin/consumers/{unique('p')}"), json={"retry": retry})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_retry", r.text
