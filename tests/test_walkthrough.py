"""Fixes from a new user's walk-through (issue 13) that no other test file owns: what `make run`
installs, the README's account of the ack checks, and the errors a first request may meet."""

from __future__ import annotations

import re
import subprocess

import pytest

from .helpers import ROOT, Api


def test_make_run_installs_only_what_run_needs() -> None:
    """Chromium renders the report in the tests only: `make run` must not install it (an apt lock
    held elsewhere stopped the gateway from starting)."""
    run = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    test = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert run.returncode == 0 and test.returncode == 0, run.stderr + test.stderr
    assert "redis-server" in run.stdout and "chromium" not in run.stdout
    assert "chromium" in test.stdout


def test_readme_lists_the_ack_checks_in_the_order_ack_lua_makes_them() -> None:
    lua = (ROOT / "gateway" / "store" / "lua" / "ack.lua").read_text()
    order = [r for r in re.findall(r"return \{'([a-z_]+)'", lua) if r != "committed"]
    readme = (ROOT / "README.md").read_text()
    block = readme.split("**Ack rules.**", 1)[1].split("\n2. ", 1)[0].split("\n4. ", 1)[0]
    listed = re.findall(r"→ `([a-z_]+)`", block)
    assert listed == order, f"README lists {listed}, ack.lua checks {order}"


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
