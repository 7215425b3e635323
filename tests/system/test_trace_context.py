"""W3C trace context end to end (core/trace.py): a produce's ``traceparent``/``tracestate``
go into its records' headers (a record's own wins, a malformed one is dropped), survive the
delay wheel and a retry, and come back on fetch, as record headers and, asked with ``Prefer:
trace-context``, as the answer's own headers; REST v2 produce and records alike. Two nodes
taking turns, the relay on both, the real broker."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..support import LEVELS, Node, start_node, unique

pytestmark = pytest.mark.rocketmq

T1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
T2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
T3 = "00-11111111111111111111111111111111-2222222222222222-00"


def headers_of(m: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in m["headers"]}


def test_trace_context_rides_produce_the_wheel_retries_and_fetch(
        redis_url: str, bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    tag = unique("tc")
    nodes: list[Node] = []
    try:
        for _ in range(2):
            nodes.append(start_node(redis_url, bootstrap, tmp_path, relay="true",
                                    delay_levels=LEVELS, delay_topic_prefix=f"{tag}.d.",
                                    delay_partitions=2, retry_topic_prefix=f"{tag}.r.",
                                    retry_partitions=2, dead_letter_prefix=f"{tag}.dead."))
        urls = [n.url for n in nodes]
        topic, group = make_topic(1), unique("g")
        http = httpx.Client(timeout=30)
        r = http.put(f"{urls[0]}/admin/consumers/{group}", json={
            "topics": [topic], "start": "earliest", "retry": {"delaysMs": [200], "maxAttempts": 3}})
        assert r.status_code == 201, r.text
        r = http.post(urls[1] + "/produce", headers={"traceparent": T1, "tracestate": "v=1,w=2"},
                      json={"topic": topic, "messages": [
                          {"value": "wheel", "delayMs": 300},
                          {"value": "own", "headers": {"traceparent": T2}}]})
        assert r.status_code == 200, r.text
        r = http.post(urls[0] + "/produce", headers={"traceparent": "00-xyz-bad-01"},
                      json={"topic": topic, "value": "bad"})
        assert r.status_code == 200, r.text
        r = http.post(f"{urls[1]}/topics/{topic}", headers={
            "traceparent": T3, "content-type": "application/vnd.kafka.json.v2+json"},
            json={"records": [{"value": "v2"}]})
        assert r.status_code == 200, r.text

        seen: dict[str, dict[str, str]] = {}
        answers: dict[str, dict[str, str]] = {}
        retried = ""
        deadline = time.monotonic() + 60
        i = 0
        while time.monotonic() < deadline and not (len(seen) == 4 and retried):
            i += 1
            r = http.get(urls[i % 2] + "/message", headers={"prefer": "trace-context"},
                         params={"consumer": group, "topic": topic, "max": 1, "wait_ms": 500})
            assert r.status_code == 200, r.text
            body = r.json()
            if body["status"] != "ok":
                continue
            assert r.headers["preference-applied"] == "trace-context"
            m, = body["messages"]
            h = headers_of(m)
            if m["attempt"] > 1:  # the retry of "wheel", back through the wheel
                retried = h.get("traceparent", "none")
                assert h.get("tracestate") == "v=1,w=2"
                http.post(urls[i % 2] + "/ack", json={"requestId": body["requestId"]})
                continue
            value = m["value"].strip('"')  # the v2 json record holds its JSON text
            seen[value] = h
            answers[value] = {k: r.headers.get(k, "") for k in ("traceparent", "tracestate")}
            if m["value"] == "wheel":  # failed once: retried after 200 ms through the wheel
                r = http.post(urls[i % 2] + "/nack", json={"requestId": body["requestId"]})
                assert r.status_code == 200, r.text
            else:
                http.post(urls[i % 2] + "/ack", json={"requestId": body["requestId"]})
        assert set(seen) == {"wheel", "own", "bad", "v2"}, seen
        assert (seen["wheel"].get("traceparent"), seen["wheel"].get("tracestate")) == (T1, "v=1,w=2")
        assert seen["own"].get("traceparent") == T2  # its own context, not the request's
        assert "tracestate" not in seen["own"]
        assert "traceparent" not in seen["bad"]  # malformed: dropped
        assert seen["v2"].get("traceparent") == T3
        assert retried == T1
        # the answer's own headers: the (only) record's context
        assert answers["wheel"] == {"traceparent": T1, "tracestate": "v=1,w=2"}
        assert answers["own"]["traceparent"] == T2 and answers["bad"]["traceparent"] == ""
        # REST v2 records, asked the same way
        r = http.post(f"{urls[0]}/consumers/{group}-v2", json={
            "name": "i", "format": "binary", "auto.offset.reset": "earliest", "max.poll.records": 1},
            headers={"content-type": "application/vnd.kafka.v2+json"})
        base = r.json()["base_uri"]
        http.post(base + "/subscription", json={"topics": [topic]},
                  headers={"content-type": "application/vnd.kafka.v2+json"})
        found = ""
        for j in range(40):
            r = http.get(base.replace(urls[0], urls[j % 2]) + "/records", params={"timeout": 300},
                         headers={"accept": "application/vnd.kafka.binary.v2+json",
                                  "prefer": "trace-context"})
            assert r.status_code == 200, r.text
            if any(base64.b64decode(rec["value"]) == b'"v2"' for rec in r.json()):
                found = r.headers.get("traceparent", "")
                break
        assert found == T3
        http.delete(base)
    finally:
        for n in nodes:
            n.stop()
