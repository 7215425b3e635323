"""The ``mqgw admin ... list`` answers as tables for people (``--json`` prints the API's JSON).

``mqgw admin topics list`` printed ~270 lines of JSON for 4 topics (every partition's replicas
and offsets): a table says per topic what an operator scans for, and ``topics describe`` or
``--json`` has the rest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

Row = dict[str, Any]
Column = tuple[str, Callable[[Row], Any]]


def _names(v: Any) -> str:
    return ",".join(str(x) for x in v) if v else "-"


def _when(ms: Any) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _yes(v: Any) -> str:
    return "yes" if v else "no"


def _end(t: Row) -> str:
    ends = [p.get("endOffset") for p in t.get("partitions") or []]
    known = [e for e in ends if isinstance(e, int)]
    return f"{sum(known):,}" + ("" if len(known) == len(ends) else " (some unknown)")


#: command -> (the list's key in the answer, its columns)
TABLES: dict[str, tuple[str, list[Column]]] = {
    "consumers-list": ("consumers", [
        ("CONSUMER", lambda c: c["consumer"]), ("REGISTERED", lambda c: _yes(c.get("registered"))),
        ("MODE", lambda c: c.get("mode") or "-"), ("TOPICS", lambda c: _names(c.get("topics"))),
        ("PAUSED", lambda c: _yes(c.get("paused"))), ("SHARDS", lambda c: c.get("shards", 1)),
        ("UPDATED (UTC)", lambda c: _when(c.get("updatedMs")))]),
    "producers-list": ("producers", [
        ("PRODUCER", lambda p: p["producer"]), ("TOPICS", lambda p: _names(p.get("topics"))),
        ("UPDATED (UTC)", lambda p: _when(p.get("updatedMs")))]),
    "topics-list": ("topics", [
        ("TOPIC", lambda t: t["name"]), ("PARTITIONS", lambda t: t.get("partitionCount")),
        ("REPLICAS", lambda t: t.get("replicationFactor") or "-"),
        ("RECORDS WRITTEN", _end), ("INTERNAL", lambda t: _yes(t.get("internal")))]),
    "keys-list": ("keys", [
        ("ID", lambda k: k["id"]), ("NAME", lambda k: k.get("name")),
        ("ADMIN", lambda k: _yes(k.get("admin"))), ("PRODUCERS", lambda k: _names(k.get("producers"))),
        ("CONSUMERS", lambda k: _names(k.get("consumers"))),
        ("CREATED (UTC)", lambda k: _when(k.get("createdMs")))]),
}


def render(command: str, data: Any) -> str | None:
    """``data`` (a list command's answer) as an aligned table, or None when ``command`` has no
    table or the answer is not the shape it expects (then the JSON is printed)."""
    spec = TABLES.get(command)
    if spec is None or not isinstance(data, dict) or not isinstance(data.get(spec[0]), list):
        return None
    key, columns = spec
    try:
        rows = [[str(fn(item)) for _, fn in columns] for item in data[key]]
    except (KeyError, TypeError, AttributeError):
        return None
    if not rows:
        return f"(no {key})"
    heads = [h for h, _ in columns]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [heads, *rows]]
    return "\n".join(lines)
