"""A full Redis (``maxmemory`` reached with ``noeviction``, as the deploy files configure it)
refuses writes: fetches, acks and admin writes answer 503 ``unavailable`` with Retry-After, not
500, and everything works again once memory is freed. Reads that write nothing still work."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from gateway.cli import devstack

from ..support import start_node, unique


@pytest.mark.timeout(120)
def test_a_full_redis_is_unavailable_not_an_internal_error(bootstrap: str, tmp_path: Path,
                                                            make_topic) -> None:
    own = devstack.start_redis()
    node = None
    try:
        node = start_node(own.extra["url"], bootstrap, tmp_path)
        r = redis.Redis.from_url(own.extra["url"])
        topic, group = make_topic(partitions=1), unique("full")
        with httpx.Client(base_url=node.url, timeout=30) as http:
            assert http.patch(f"/admin/consumers/{group}", json={"start": "earliest"}).status_code == 200
            assert http.post("/produce", json={"topic": topic, "value": "x"}).status_code == 200
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", 1)  # below what it uses: every write is refused
            for method, path, kw in [
                ("GET", "/message", {"params": {"consumer": group, "topic": topic}}),
                ("PATCH", f"/admin/consumers/{group}", {"json": {"consumeTimeoutMs": 5000}}),
            ]:
                got = http.request(method, path, **kw)
                assert got.status_code == 503, (path, got.text)
                assert got.json()["error"]["code"] == "unavailable"
                assert got.headers["retry-after"] == "1"
            assert http.get(f"/admin/consumers/{group}").status_code == 200  # a read still works
            r.config_set("maxmemory", 0)  # memory freed (or added)
            got = http.get("/message", params={"consumer": group, "topic": topic, "wait_ms": 5000})
            assert got.status_code == 200 and [m["value"] for m in got.json()["messages"]] == ["x"]
            assert http.post("/ack", json={"requestId": got.json()["requestId"]}).status_code == 200
    finally:
        if node is not None:
            node.stop()
        own.stop()
