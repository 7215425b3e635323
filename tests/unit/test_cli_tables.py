"""``mqgw admin ... list`` prints tables (cli/tables.py); ``--json`` the API's answer."""

from __future__ import annotations

import argparse

from gateway.cli import admin
from gateway.cli.tables import render


def parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    admin.add_commands(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(["admin", *argv])


def test_topics_list_is_one_line_a_topic() -> None:
    parts = [{"partition": i, "leader": 1, "replicas": [1], "inSync": [1], "earliestOffset": 0,
              "endOffset": 10 * i} for i in range(64)]
    data = {"topics": [{"name": n, "internal": False, "partitionCount": 64, "replicationFactor": 1,
                        "partitions": parts} for n in ("a", "orders", "orders-dlq", "z")]}
    out = render("topics-list", data)
    assert out is not None
    lines = out.splitlines()
    assert len(lines) == 5 and lines[0].split() == ["TOPIC", "PARTITIONS", "REPLICAS", "RECORDS",
                                                    "WRITTEN", "INTERNAL"]
    assert lines[2].split() == ["orders", "64", "1", "20,160", "no"]


def test_other_lists_and_what_is_not_a_table() -> None:
    keys = {"keys": [{"id": "0123456789abcdef", "name": "svc", "admin": False, "producers": [],
                      "consumers": ["billing"], "createdMs": 1795310000000}]}
    out = render("keys-list", keys)
    assert out is not None and "billing" in out and "2026-11-22 01:13:20" in out
    assert render("consumers-list", {"consumers": []}) == "(no consumers)"
    assert render("consumers-get", {"consumer": "x"}) is None  # not a list: JSON
    assert render("topics-list", {"error": {"code": "x"}}) is None  # not the expected shape


def test_list_commands_take_json_and_consumers_take_shards() -> None:
    a = parse("topics", "list", "--json")
    assert a.command == "topics-list" and a.json is True
    assert parse("keys", "list").json is False
    a = parse("consumers", "register", "g1", "--topic", "t", "--shards", "3")
    assert admin._call(a)[2] == {"topics": ["t"], "shards": 3}
