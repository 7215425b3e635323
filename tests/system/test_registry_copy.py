"""The registry's durable copy in the broker (core/registry_copy.py): a Redis restarted empty
gets back keys, registrations, policies and pauses, with auth on. Real redis-server of the
test's own (restarted empty on the same port), the session's broker, secure gateway nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from gateway.cli import devstack

from ..support import start_secure, unique, wait_for

#: the broker adapter itself: run on every broker (tests/conftest.py)
pytestmark = pytest.mark.every_broker


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_redis_restarted_empty_gets_the_registry_back(
        bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    """Before: with auth on, an empty Redis refused every key and forgot every policy."""
    svc = devstack.start_redis()
    services = [svc]
    url = svc.extra["url"]
    sec = start_secure(url, bootstrap, tmp_path, n=2, checkpoint_interval_ms=60_000)
    rds = redis.Redis.from_url(url)
    try:
        topic = make_topic(1)
        g, paused, prod = unique("reg"), unique("paused"), unique("prod")
        retry = {"delaysMs": [100, 200], "deadLetterTopic": f"{g}.dead"}
        sec.admin("PUT", f"/admin/consumers/{g}", json={
            "topics": [topic], "start": "earliest", "retry": retry,
            "rateLimit": {"messagesPerSecond": 500, "burst": 50}})
        sec.admin("PUT", f"/admin/consumers/{paused}", json={"topics": [topic]})
        sec.admin("POST", f"/admin/consumers/{paused}/pause")
        sec.admin("PUT", f"/admin/producers/{prod}", json={"topics": [topic]})
        ckey = sec.key("svc", consumers=[g, paused])
        pkey = sec.key("prod", producers=[prod])
        before = {c: sec.admin("GET", f"/admin/consumers/{c}", node=1) for c in (g, paused)}
        assert sec.call("POST", "/produce", pkey, 0, json={"topic": topic, "value": "a"}).status_code == 200
        # the bootstrap admin key was written to Redis alone: a node copies it within a second
        wait_for(lambda: rds.exists("mqgw:{reg}:copied"), "the registry's copy to be complete")

        rds.close()
        svc.stop()
        services.append(devstack.start_redis(svc.port))  # empty, same address
        rds = redis.Redis.from_url(url)

        # restored by the nodes' watch (or their first refused request), within seconds
        wait_for(lambda: sec.call("GET", f"/admin/consumers/{g}", sec.admin_key, 1).status_code == 200,
               "the admin key to work again")
        after = {c: sec.admin("GET", f"/admin/consumers/{c}", node=0) for c in (g, paused)}
        assert after == before
        assert after[g]["retry"]["delaysMs"] == [100, 200]
        r = sec.call("GET", "/message", ckey, 1, params={"consumer": paused, "topic": topic})
        assert r.status_code == 200 and r.json()["status"] == "paused", r.text
        # start=earliest survived: the record produced before the loss is served
        r = sec.call("GET", "/message", ckey, 0, params={"consumer": g, "topic": topic, "wait_ms": 5000})
        assert r.status_code == 200 and [m["value"] for m in r.json()["messages"]] == ["a"], r.text
        r = sec.call("POST", "/produce", pkey, 1, json={"topic": topic, "value": "b"})
        assert r.status_code == 200, r.text
        other = make_topic(1)  # the producer's registration holds: not allowed there
        r = sec.call("POST", "/produce", pkey, 1, json={"topic": other, "value": "c"})
        assert r.status_code == 403, r.text
        # a revoke is copied too (a tombstone): a second loss does not bring the key back
        kid = next(k for k in sec.admin("GET", "/admin/keys")["keys"] if k["name"] == "prod")["id"]
        sec.admin("DELETE", f"/admin/keys/{kid}")
        assert sec.call("POST", "/produce", pkey, 0, json={"topic": topic, "value": "d"}).status_code == 401
        rds.close()
        services[-1].stop()
        services.append(devstack.start_redis(svc.port))
        rds = redis.Redis.from_url(url)
        wait_for(lambda: sec.call("GET", f"/admin/consumers/{g}", sec.admin_key, 0).status_code == 200,
               "the registry back after the second loss")
        assert sec.call("POST", "/produce", pkey, 1, json={"topic": topic, "value": "e"}).status_code == 401
        r = sec.call("GET", "/message", ckey, 1, params={"consumer": paused, "topic": topic})
        assert r.status_code == 200 and r.json()["status"] == "paused", r.text
    finally:
        rds.close()
        sec.http.close()
        for n in sec.nodes:
            n.stop()
        for s in services:
            s.stop()
