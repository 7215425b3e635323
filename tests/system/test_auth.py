"""API keys against real nodes: the whole 401/403 matrix, hashed storage, revocation at once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from ..support import Secure, unique


def _one(sec: Secure, key: str, topic: str, group: str, partition: int) -> dict[str, Any]:
    """Produce one record (as the producer) and fetch it (as the consumer): a live batch."""
    r = sec.call("POST", "/produce", key=sec.producer_key,  # type: ignore[attr-defined]
                 json={"topic": topic, "value": "x", "partition": partition})
    assert r.status_code == 200, r.text
    r = sec.call("GET", "/message", key=key, params={"consumer": group, "topic": topic, "max": 1,
                                                     "wait_ms": 3000})
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    return r.json()


@pytest.mark.timeout(120)
def test_every_caller_against_every_action(sec: Secure, make_topic: Callable[..., str]) -> None:
    topic, other_topic = make_topic(2), make_topic(1)
    g, g2, prod = unique("g"), unique("g"), unique("p")
    sec.admin("PUT", f"/admin/consumers/{g}", json={"topics": [topic], "start": "earliest"})
    sec.admin("PUT", f"/admin/consumers/{g2}", json={"topics": [topic]})
    sec.admin("PUT", f"/admin/producers/{prod}", json={"topics": [topic]})
    producer_key = sec.key("orders-svc", producers=[prod])
    consumer_key = sec.key("billing", consumers=[g])
    other_key = sec.key("other", consumers=[g2])
    sec.producer_key = producer_key  # type: ignore[attr-defined]
    good = consumer_key
    kid = consumer_key.split("_")[1]
    callers: dict[str, str | None] = {
        "none": None,
        "garbage": "not-a-key",
        "unknown": "mqgw_0123456789abcdef_" + "A" * 43,
        "wrong-secret": f"mqgw_{kid}_" + "B" * 43,  # a real key id with someone else's secret
        "admin": sec.admin_key,
        "producer": producer_key,
        "consumer": consumer_key,
        "other-consumer": other_key,
    }
    batch = _one(sec, good, topic, g, 0)
    unlock_batch = _one(sec, good, topic, g, 1)
    later = sec.call("POST", "/produce", producer_key, json={"topic": topic, "value": "later",
                                                             "delayMs": 3_600_000})
    delay_id = later.json()["results"][0]["delayId"]
    actions: dict[str, Callable[[str | None], Any]] = {
        "produce": lambda k: sec.call("POST", "/produce", k, 1, json={"topic": topic, "value": "m"}),
        "produce-other-topic": lambda k: sec.call("POST", "/produce", k, 1,
                                                  json={"topic": other_topic, "value": "m"}),
        "message": lambda k: sec.call("GET", "/message", k, 1, params={"consumer": g, "topic": topic,
                                                                         "max": 1}),
        "message-unknown-topic": lambda k: sec.call("GET", "/message", k, 0, params={
            "consumer": g, "topic": "no-such-topic-" + g}),  # no topic probing without a key
        "ack": lambda k: sec.call("POST", "/ack", k, 1, json={"requestId": batch["requestId"]}),
        "extend": lambda k: sec.call("POST", "/extend", k, 1, json={"requestId": unlock_batch["requestId"]}),
        "unlock": lambda k: sec.call("POST", "/unlock", k, 0, json={"requestId": unlock_batch["requestId"]}),
        "queues-view": lambda k: sec.call("GET", f"/consumers/{g}/queues", k, 1),
        "clients-view": lambda k: sec.call("GET", f"/consumers/{g}/clients", k, 0),
        "admin-list": lambda k: sec.call("GET", "/admin/consumers", k, 0),
        "admin-pause": lambda k: sec.call("POST", f"/admin/consumers/{g2}/pause", k, 1),
        "admin-keys": lambda k: sec.call("GET", "/admin/keys", k, 0),
        "cancel-delayed": lambda k: sec.call("DELETE", f"/delayed/{delay_id}", k, 1),
    }
    bad = {"none": 401, "garbage": 401, "unknown": 401, "wrong-secret": 401}
    expected: dict[str, dict[str, int]] = {
        "produce": {**bad, "admin": 403, "producer": 200, "consumer": 403, "other-consumer": 403},
        "produce-other-topic": {**bad, "admin": 403, "producer": 403, "consumer": 403, "other-consumer": 403},
        "message": {**bad, "admin": 403, "producer": 403, "consumer": 200, "other-consumer": 403},
        "message-unknown-topic": {**bad, "admin": 403, "producer": 403, "consumer": 404,
                                  "other-consumer": 403},
        "ack": {**bad, "admin": 403, "producer": 403, "consumer": 200, "other-consumer": 403},
        "extend": {**bad, "admin": 403, "producer": 403, "consumer": 200, "other-consumer": 403},
        "unlock": {**bad, "admin": 403, "producer": 403, "consumer": 200, "other-consumer": 403},
        "queues-view": {**bad, "admin": 200, "producer": 403, "consumer": 200, "other-consumer": 403},
        "clients-view": {**bad, "admin": 200, "producer": 403, "consumer": 200, "other-consumer": 403},
        "admin-list": {**bad, "admin": 200, "producer": 403, "consumer": 403, "other-consumer": 403},
        "admin-pause": {**bad, "admin": 200, "producer": 403, "consumer": 403, "other-consumer": 403},
        "admin-keys": {**bad, "admin": 200, "producer": 403, "consumer": 403, "other-consumer": 403},
        # the record's producer, and an operator (the console's Delayed view)
        "cancel-delayed": {**bad, "admin": 200, "producer": 200, "consumer": 403,
                           "other-consumer": 403},
    }
    seen: dict[tuple[str, str], int] = {}
    # Allowed calls last, so refused acks/unlocks are tried while the batch is still live.
    for action, fn in actions.items():
        order = sorted(callers, key=lambda c: expected[action][c] == 200)
        for caller in order:
            r = fn(callers[caller])
            seen[(action, caller)] = r.status_code
            code = r.json().get("error", {}).get("code")
            if r.status_code == 401:
                assert code in ("missing_api_key", "invalid_api_key"), r.text
                assert r.headers["www-authenticate"].startswith("Bearer")
            elif r.status_code == 403:
                assert code in ("forbidden", "topic_not_allowed"), r.text
    want = {(a, c): expected[a][c] for a in actions for c in callers}
    assert seen == want, {k: (seen[k], want[k]) for k in want if seen[k] != want[k]}
    # The refused acks changed nothing; the consumer's own ack committed.
    assert sec.call("POST", "/ack", good, json={"requestId": batch["requestId"]}).json()["result"] \
        == "already_committed"


@pytest.mark.timeout(60)
def test_keys_are_stored_hashed_and_revocation_is_seen_by_every_node(
        sec: Secure, make_topic: Callable[..., str], rds: redis.Redis) -> None:
    topic, g = make_topic(1), unique("g")
    sec.admin("PUT", f"/admin/consumers/{g}", json={"topics": [topic]})
    created = sec.admin("POST", "/admin/keys", json={"name": "svc", "consumers": [g]})
    key, kid = created["key"], created["id"]
    secret = key.split("_", 2)[2]
    for k in rds.scan_iter(match="mqgw:*", count=1000):
        kind = rds.type(k).decode()
        dump = repr(rds.hgetall(k) if kind == "hash" else rds.smembers(k) if kind == "set"
                    else rds.zrange(k, 0, -1) if kind == "zset" else rds.get(k) if kind == "string" else b"")
        assert secret not in dump and key not in dump, k
    listed = sec.admin("GET", "/admin/keys")["keys"]
    assert any(k["id"] == kid for k in listed) and all("key" not in k and "sha256" not in k for k in listed)
    ok = sec.call("GET", "/message", key, 0, params={"consumer": g, "topic": topic})
    assert ok.status_code == 200, ok.text
    assert sec.admin("DELETE", f"/admin/keys/{kid}", node=0)["revoked"] is True
    r = sec.call("GET", "/message", key, 1, params={"consumer": g, "topic": topic})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert sec.call("GET", f"/admin/keys/{kid}", sec.admin_key, 1).status_code == 404


@pytest.mark.slow  # one `mqgw admin` process per command
@pytest.mark.timeout(60)
def test_admin_cli_drives_the_admin_api(sec: Secure, make_topic: Callable[..., str], tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from ..support import ROOT

    topic, g = make_topic(2), unique("g")

    def mqgw(*args: str, ok: bool = True) -> Any:
        p = subprocess.run([sys.executable, "-m", "gateway", "admin", "--url", sec.nodes[1].url,
                            "--key", sec.admin_key, *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=30)
        assert (p.returncode == 0) == ok, p.stderr
        return json.loads(p.stdout) if ok else p.stderr

    reg = mqgw("consumers", "register", g, "--topic", topic, "--mode", "broadcast", "--rate", "50",
               "--alert-backlog", "100", "--start", "earliest")
    assert reg["registered"] and reg["mode"] == "broadcast" and reg["rateLimit"]["messagesPerSecond"] == 50
    assert sec.admin("GET", f"/admin/consumers/{g}", node=0) == reg  # seen by the other node
    assert mqgw("pause", g) == {"consumer": g, "paused": True}
    assert mqgw("consumers", "set", g, "--no-rate-limit")["rateLimit"] is None
    assert mqgw("resume", g)["paused"] is False
    moved = mqgw("reset", g, "--topic", topic, "--to", "latest", "--client-id", "*")
    assert moved["consumer"] == g and moved["to"] == "latest"
    assert "missing_topics" in mqgw("consumers", "register", unique("g"), ok=False)
    created = mqgw("keys", "create", "cli-key", "--consumer", g)
    assert created["key"].startswith("mqgw_") and created["consumers"] == [g]
    assert mqgw("keys", "revoke", created["id"])["revoked"] is True
    assert mqgw("consumers", "unregister", g, "--delete-offsets")["unregistered"] is True
    denied = subprocess.run([sys.executable, "-m", "gateway", "admin", "--url", sec.nodes[0].url,
                             "consumers", "list"], cwd=ROOT, capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin"})
    assert denied.returncode == 1 and "401" in denied.stderr and "missing_api_key" in denied.stderr


@pytest.mark.timeout(60)
def test_refused_callers_leave_no_consumer_names_behind(sec: Secure, make_topic, rds) -> None:
    """Names reach the consumer listing (and so the backlog view, alerts and /metrics labels)
    only after choose.lua accepted the key and the registration: a stranger cannot add any."""
    topic = make_topic(1)
    junk = unique("junk")
    bogus = "mqgw_0000000000000000_" + "A" * 43
    for key in (bogus, None):
        r = sec.call("GET", f"/message?consumer={junk}&topic={topic}", key)
        assert r.status_code == 401
    g = unique("g")  # a real consumer with a real key is listed
    sec.admin("PUT", f"/admin/consumers/{g}", json={"topics": [topic]})
    key = sec.key("svc", consumers=[g])
    assert sec.call("GET", f"/message?consumer={g}&topic={topic}", key).status_code == 200
    seen = {m.decode() for m in rds.zrange("mqgw:{reg}:seen_at", 0, -1)}
    assert g in seen and junk not in seen
    assert junk not in {c["consumer"] for c in sec.admin("GET", "/admin/consumers")["consumers"]}


@pytest.mark.timeout(60)
def test_cached_produce_verdicts_never_outlive_a_revocation_or_a_registration_change(
        sec: Secure, make_topic: Callable[..., str]) -> None:
    """Every node caches "this key may produce as P to T" (core/produce.py ProduceGate); a key
    revoked or a registration changed through any node applies to the very next produce on every
    node, because the admin call returns only once every process dropped its cached verdicts."""
    t1, t2, p = make_topic(1), make_topic(1), unique("p")
    sec.admin("PUT", f"/admin/producers/{p}", json={"topics": [t1, t2]})
    key = sec.key("prod", producers=[p])

    def produce(node: int, topic: str) -> int:
        r = sec.call("POST", "/produce", key, node, json={"topic": topic, "value": "v"})
        return r.status_code

    for _ in range(3):  # cached on both nodes
        assert [produce(n, t) for n in (0, 1) for t in (t1, t2)] == [200] * 4
    sec.admin("PUT", f"/admin/producers/{p}", json={"topics": [t1]}, node=0)
    assert [produce(1, t2), produce(0, t2)] == [403, 403]  # at once, on both
    assert [produce(1, t1), produce(0, t1)] == [200, 200]
    kid = next(k["id"] for k in sec.admin("GET", "/admin/keys")["keys"] if k["producers"] == [p])
    assert sec.admin("DELETE", f"/admin/keys/{kid}", node=1)["revoked"] is True
    assert [produce(0, t1), produce(1, t1)] == [401, 401]


#: Requests whose input is also wrong, one per route that takes a key: (method, path, kw).
BAD_INPUT: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/message", {"params": {"consumer": "a:b", "topic": "t"}}),
    ("GET", "/message", {"params": {"consumer": "g", "topic": "t", "max": "many"}}),
    ("POST", "/message", {"content": b"{not json"}),
    ("POST", "/produce", {"json": {"topic": "t"}}),
    ("POST", "/produce?typo=1", {"json": {"topic": "t", "value": "x"}}),
    ("POST", "/produce", {"json": {"topic": "t", "value": "x", "delayMs": 1, "deliverAt": 1}}),
    ("POST", "/ack", {"json": {}}),
    ("POST", "/ack", {"json": {"requestId": "garbage"}}),
    ("POST", "/nack", {"json": {"requestId": "garbage", "failed": "x"}}),
    ("POST", "/extend", {"json": {"requestId": 5}}),
    ("POST", "/unlock", {"json": {"requestId": 5}}),
    ("DELETE", "/delayed/garbage", {}),
    ("GET", "/consumers/a:b/queues", {}),
    ("GET", "/consumers/nobody-ever/clients", {}),
    ("GET", "/consumers/g/clients/a:b/queues", {}),
    ("GET", "/admin/consumers?x=1", {}),
    ("GET", "/admin/consumers/nobody-ever", {}),
    ("PUT", "/admin/consumers/g", {"json": {"topics": "t"}}),
    ("PATCH", "/admin/consumers/g", {"json": {"maxBatch": 0}}),
    ("DELETE", "/admin/consumers/g?deleteOffsets=maybe", {}),
    ("POST", "/admin/consumers/a:b/pause", {}),
    ("POST", "/admin/consumers/g/reset", {"json": {"to": "nowhere"}}),
    ("GET", "/admin/consumers/g/dead-letters?partition=-1", {}),
    ("POST", "/admin/consumers/g/dead-letters/redrive", {"json": {"target": "x"}}),
    ("GET", "/admin/producers?x=1", {}),
    ("PUT", "/admin/producers/p", {"json": {}}),
    ("POST", "/admin/keys", {"json": {"name": "k"}}),
    ("GET", "/admin/keys/nope?x=1", {}),
    ("GET", "/admin/backlog?consumer=a:b", {}),
    ("GET", "/admin/alerts?all=maybe", {}),
]


@pytest.mark.timeout(60)
def test_a_bad_key_is_told_before_bad_input(sec: Secure) -> None:
    """A well-formed key that is unknown, or was revoked, got 400 invalid_* (or 404) when the
    input was also bad; docs/api.md says a wrong key gets 401: the key is checked first."""
    revoked = sec.key("soon-revoked", admin=True, consumers=["g"], producers=["p"])
    kid = revoked.split("_")[1]
    sec.admin("DELETE", f"/admin/keys/{kid}")
    unknown = "mqgw_0123456789abcdef_" + "A" * 43
    for key in (unknown, revoked, None):
        for method, path, kw in BAD_INPUT:
            r = sec.call(method, path, key, **kw)
            want = "missing_api_key" if key is None else "invalid_api_key"
            assert r.status_code == 401 and r.json()["error"]["code"] == want, (method, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
    # with a good key the same requests are refused for their input (or their name), not the key
    for method, path, kw in BAD_INPUT:
        r = sec.call(method, path, sec.admin_key, **kw)
        assert r.status_code in (400, 404), (method, path, r.text)
