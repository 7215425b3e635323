"""Fixes from a new user's walk-through (issue 13) that no other test file owns: what `make run`
installs, the docs' account of the ack checks, and the errors a first request may meet."""

from __future__ import annotations

import re
import subprocess

import pytest

from ..support import ROOT, Api
from ..support.openapi import check as documented


def test_make_run_installs_only_what_run_needs() -> None:
    """Chromium renders the report in the tests only: `make run` must not install it (an apt lock
    held elsewhere stopped the gateway from starting)."""
    run = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    test = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert run.returncode == 0 and test.returncode == 0, run.stderr + test.stderr
    assert "redis-server" in run.stdout and "chromium" not in run.stdout
    assert "chromium" in test.stdout


def test_docs_list_the_ack_checks_in_the_order_ack_lua_makes_them() -> None:
    """ack.lua checks the key, then the batch (the prelude's ``ack_batch``, which
    instance_commit.lua shares, asks ``batch_refusal``, which extend.lua shares), in the order
    the docs list."""
    lua_dir = ROOT / "gateway" / "store" / "lua"
    ack, prelude = (lua_dir / "ack.lua").read_text(), (lua_dir / "prelude.lua").read_text()
    assert ack.index("'unauthorized'") < ack.index("ack_batch(")
    acking = prelude.split("local function ack_batch", 1)[1].split("\nend\n", 1)[0]
    assert "batch_refusal(" in acking
    batch = prelude.split("local function batch_refusal", 1)[1].split("\nend\n", 1)[0]
    order = ["unauthorized", *re.findall(r"return '([a-z_]+)'", batch)]
    doc = (ROOT / "docs" / "delivery-semantics.md").read_text()
    block = doc.split("**Ack rules.**", 1)[1].split("\n2. ", 1)[0].split("\n4. ", 1)[0]
    listed = re.findall(r"→ `([a-z_]+)`", block)
    assert listed == order, f"docs/delivery-semantics.md lists {listed}, ack.lua checks {order}"


def test_a_garbage_request_id_is_called_malformed_not_forged(api: Api) -> None:
    r = api.ack("garbage")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request_id"
    assert "malformed" in r.json()["error"]["message"]
    assert "signature" not in r.json()["error"]["message"]


@pytest.mark.parametrize("params", [{"maxx": "5"}, {"wait": "100"}, {"consumer_id": "x"}])
def test_message_refuses_unknown_parameters(api: Api, make_topic, params: dict) -> None:
    topic = make_topic(partitions=1)
    api.config("walk-typo", start="earliest")
    api.produce(topic, ["a"])
    r = api.message(consumer="walk-typo", topic=topic, **params)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "unknown_parameter"
    assert r.json()["error"]["details"]["parameters"] == sorted(params)
    # and nothing was locked: the right request gets the record at once
    ok = api.message(consumer="walk-typo", topic=topic, wait_ms=5000).json()
    assert [m["value"] for m in ok["messages"]] == ["a"]


def test_a_record_over_the_limit_says_its_size_and_the_limit(api: Api, make_topic) -> None:
    topic = make_topic(partitions=1)
    r = api.http.post(api.url("/produce"), json={"topic": topic, "messages": [
        {"value": "x" * 1_500_000}, {"value": "small"}]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["failed"] == 1
    err = body["results"][0]["error"]
    assert err["code"] == "message_too_large"
    assert "1,500,000 bytes" in err["message"] and "1,000,000 bytes" in err["message"]
    assert "message.max.bytes" in err["message"]
    assert "offset" in body["results"][1]  # the other record of the request is written


@pytest.mark.parametrize("env, says", [
    ({"MQGW_AUTH": "maybe"}, "auth (MQGW_AUTH) must be true or false, not 'maybe'"),
    ({"MQGW_MAX_WAIT_MS": "30s"}, "max_wait_ms (MQGW_MAX_WAIT_MS) must be an integer, not '30s'"),
    ({"MQGW_START_POSITION": "first"}, "start_position (MQGW_START_POSITION) must be 'latest'"),
    ({"MQGW_CONFIG": "/nonexistent/gateway.toml"}, "MQGW_CONFIG=/nonexistent/gateway.toml"),
])
def test_a_bad_setting_is_one_plain_line_not_a_traceback(env: dict[str, str], says: str) -> None:
    import os
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQGW_")}
    p = subprocess.run([sys.executable, "-m", "gateway", "serve", "--port", "1"], cwd=ROOT,
                       env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mqgw: bad setting: ") and says in lines[0], p.stderr


def test_the_gateways_own_consumers_and_topics_are_not_public(api: Api, make_topic) -> None:
    """Pausing `_mqgw.relay` stopped every delayed record, resetting it lost them, and a record
    produced straight into a level topic bypassed the wheel's headers: all refused now."""
    topic = make_topic(partitions=1)
    for group in ("_mqgw.relay", "_mqgw.deadletters", "_mqgw-anything"):
        refused = [
            api.message(consumer=group, topic=topic),
            api.http.post(api.url(f"/admin/consumers/{group}/pause")),
            api.http.post(api.url(f"/admin/consumers/{group}/resume")),
            api.http.post(api.url(f"/admin/consumers/{group}/reset"),
                          json={"topic": "mqgw.delay.3000ms", "to": "latest"}),
            api.http.patch(api.url(f"/admin/consumers/{group}"), json={"start": "earliest"}),
            api.http.delete(api.url(f"/admin/consumers/{group}")),
        ]
        templates = ["/message", "/admin/consumers/{consumer}/pause", "/admin/consumers/{consumer}/resume",
                     "/admin/consumers/{consumer}/reset", "/admin/consumers/{consumer}",
                     "/admin/consumers/{consumer}"]
        for r, template in zip(refused, templates, strict=True):
            documented(r, template, 400, "reserved_consumer")
    r = api.http.post(api.url("/admin/keys"), json={"name": "k", "consumers": ["_mqgw.relay"]})
    documented(r, "/admin/keys", 400, "reserved_consumer")  # no key may consume as the relay
    # watching the relay is what the views are for
    assert api.http.get(api.url("/consumers/_mqgw.relay/queues")).status_code == 200
    assert api.http.get(api.url("/admin/backlog"), params={"consumer": "_mqgw.relay"}).status_code == 200
    for internal in ("mqgw.delay.100ms", "mqgw.retry.g.t.0123456789"):
        r = api.http.post(api.url("/produce"), json={"topic": internal, "value": "x"})
        documented(r, "/produce", 403, "internal_topic")


@pytest.mark.parametrize("name", [".", ".."])
def test_dot_names_are_refused(api: Api, name: str) -> None:
    """`..` as a consumer became `/admin/consumers/..`, which clients resolve to `/admin`."""
    documented(api.message(consumer=name, topic="t"), "/message", 400, "invalid_consumer")
    documented(api.message(consumer="g", topic=name), "/message", 400, "invalid_topic")


@pytest.mark.parametrize("method, path, template, kw", [
    ("POST", "/produce?topci=demo", "/produce", {"json": {"topic": "t", "value": "x"}}),
    ("POST", "/produce?dry_run=true", "/produce", {"json": {"topic": "t", "value": "x"}}),
    ("POST", "/admin/consumers/walk-q/pause?now=1", "/admin/consumers/{consumer}/pause", {}),
    ("POST", "/admin/consumers/walk-q/reset?x=1", "/admin/consumers/{consumer}/reset",
     {"json": {"topic": "t", "to": "latest"}}),
    ("PUT", "/admin/consumers/walk-q?force=1", "/admin/consumers/{consumer}", {"json": {"topics": ["t"]}}),
    ("GET", "/admin/consumers?all=1", "/admin/consumers", {}),
    ("GET", "/admin/producers?limit=5", "/admin/producers", {}),
    ("GET", "/admin/producers/p?x=1", "/admin/producers/{name}", {}),
    ("GET", "/admin/keys?x=1", "/admin/keys", {}),
    ("GET", "/admin/keys/0123456789abcdef?x=1", "/admin/keys/{key_id}", {}),
    ("GET", "/consumers/walk-q/queues?topic=t", "/consumers/{consumer}/queues", {}),
    ("GET", "/consumers/walk-q/clients?x=1", "/consumers/{consumer}/clients", {}),
])
def test_operations_without_query_parameters_refuse_any(api: Api, method: str, path: str,
                                                       template: str, kw: dict) -> None:
    r = api.http.request(method, api.url(path), **kw)
    documented(r, template, 400, "unknown_parameter")


def test_a_misspelt_value_is_named(api: Api) -> None:
    r = api.http.post(api.url("/produce"), json={"topic": "t", "vaule": "x"})
    assert "vaule" in documented(r, "/produce", 400, "unknown_field")["error"]["message"]


def test_delays_end_in_the_year_9999_on_every_path(api: Api, make_topic) -> None:
    topic = make_topic(partitions=1)
    api.config("walk-nack", start="earliest")
    api.produce(topic, ["a"])
    got = api.message(consumer="walk-nack", topic=topic, wait_ms=5000).json()
    far = 253_402_300_799_999  # the last ms of 9999 as a delay: due far beyond it
    for path, body in [("/nack", {"requestId": got["requestId"], "delayMs": far}),
                       ("/ack", {"requestId": got["requestId"],
                                 "failed": [{"offset": got["offset"], "delayMs": far}]})]:
        r = api.http.post(api.url(path), json=body)
        assert "9999" in documented(r, path, 400, "invalid_delay")["error"]["message"]
    assert api.ack(got["requestId"]).json()["result"] == "committed"  # nothing was written
    r = api.http.post(api.url("/produce"), json={"topic": topic, "value": "x",
                                                 "deliverAt": "10000-01-01T00:00:00Z"})
    assert r.status_code == 400 and "9999" in r.json()["error"]["message"], r.text
