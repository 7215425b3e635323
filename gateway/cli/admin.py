"""``mqgw admin ...`` and ``mqgw keys bootstrap``: the admin API from a shell.

Every ``admin`` command is one HTTP call to a gateway node (``--url`` / ``MQGW_URL``) with an
admin key (``--key`` / ``MQGW_ADMIN_KEY``); it prints the JSON answer (a ``list`` a table:
cli/tables.py, unless ``--json``) and exits 0 on success, 1 with the error on stderr
otherwise. ``keys bootstrap`` is the only command that talks to Redis directly: it creates the
first admin key, before any key exists to call the API with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from .tables import render

Call = tuple[str, str, dict[str, Any] | None, dict[str, str] | None]  # method, path, body, query


def _consumer_body(a: argparse.Namespace, partial: bool) -> dict[str, Any]:
    """The API body of ``consumers register`` (PUT) or ``set`` (PATCH): only the options given.
    The API merges a PATCH into what is set, inside ``rateLimit``, ``retry`` and ``alerts`` too,
    so ``set --burst 5`` keeps the rate and ``set --retry-max-attempts 3`` the schedule."""
    body: dict[str, Any] = {}
    if a.topic:
        body["topics"] = a.topic
    for opt, field in (("mode", "mode"), ("timeout_ms", "consumeTimeoutMs"), ("max_batch", "maxBatch"),
                       ("start", "start"), ("shards", "shards")):
        if getattr(a, opt) is not None:
            body[field] = getattr(a, opt)
    if partial and a.no_rate_limit:
        body["rateLimit"] = None
    else:
        rate = {k: v for k, v in (("messagesPerSecond", a.rate), ("burst", a.burst)) if v is not None}
        if rate:  # a burst alone: the server says so if there is no rate to keep
            body["rateLimit"] = rate
    alerts = {k: v for k, v in (("backlogMessages", a.alert_backlog), ("oldestAgeMs", a.alert_age_ms))
              if v is not None}
    if alerts:
        body["alerts"] = alerts
    retry: dict[str, Any] = {k: v for k, v in (
        ("maxAttempts", a.retry_max_attempts), ("deadLetterTopic", a.dead_letter_topic),
        ("delaysMs", [int(d) for d in a.retry_delays_ms.split(",")] if a.retry_delays_ms else None))
        if v is not None}
    if retry:
        body["retry"] = retry
    return body


def _reset_body(a: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"topic": a.topic, "to": a.to}
    for opt, field in (("timestamp", "timestamp"), ("offset", "offset"), ("queue", "queue"),
                       ("client_id", "clientId")):
        if getattr(a, opt) is not None:
            body[field] = getattr(a, opt)
    if a.dry_run:
        body["dryRun"] = True
    return body


def _call(a: argparse.Namespace) -> Call:
    """The HTTP request for a parsed command."""
    c, name = a.command, quote(getattr(a, "name", "") or "", safe="")
    g = f"/admin/consumers/{name}"
    table: dict[str, Callable[[], Call]] = {
        "consumers-list": lambda: ("GET", "/admin/consumers", None, None),
        "consumers-get": lambda: ("GET", g, None, None),
        "consumers-register": lambda: ("PUT", g, _consumer_body(a, False), None),
        "consumers-set": lambda: ("PATCH", g, _consumer_body(a, True), None),
        "consumers-unregister": lambda: ("DELETE", g, None,
                                         {"deleteOffsets": "true" if a.delete_offsets else "false"}),
        "pause": lambda: ("POST", f"{g}/pause", None, None),
        "resume": lambda: ("POST", f"{g}/resume", None, None),
        "reset": lambda: ("POST", f"{g}/reset", _reset_body(a), None),
        "producers-list": lambda: ("GET", "/admin/producers", None, None),
        "producers-get": lambda: ("GET", f"/admin/producers/{name}", None, None),
        "producers-register": lambda: ("PUT", f"/admin/producers/{name}", {"topics": a.topic}, None),
        "producers-unregister": lambda: ("DELETE", f"/admin/producers/{name}", None, None),
        "topics-list": lambda: ("GET", "/admin/topics", None,
                                {"internal": "true"} if a.internal else None),
        "topics-describe": lambda: ("GET", f"/admin/topics/{name}", None, None),
        "topics-create": lambda: ("POST", "/admin/topics", {
            "name": a.name, "partitions": a.partitions,
            **({"replicationFactor": a.replication_factor} if a.replication_factor is not None else {})},
            None),
        "keys-list": lambda: ("GET", "/admin/keys", None, None),
        "keys-create": lambda: ("POST", "/admin/keys", {
            "name": a.name, "admin": a.admin, "producers": a.producer, "consumers": a.consumer}, None),
        "keys-revoke": lambda: ("DELETE", f"/admin/keys/{name}", None, None),
        "backlog": lambda: ("GET", "/admin/backlog", None,
                            {"consumer": a.consumer, "age": "false" if a.no_age else "true"}),
        "alerts": lambda: ("GET", "/admin/alerts", None, {"all": "true"} if a.all else None),
        "dead-letters": lambda: ("GET", f"{g}/dead-letters", None,
                                 {"limit": a.limit, "partition": a.partition, "offset": a.offset}),
        "redrive": lambda: ("POST", f"{g}/dead-letters/redrive", {k: v for k, v in (
            ("target", a.target), ("partition", a.partition), ("toOffset", a.to_offset),
            ("limit", a.limit)) if v is not None}, None),
    }
    return table[c]()


def run_admin(a: argparse.Namespace) -> int:
    method, path, body, query = _call(a)
    headers = {"authorization": f"Bearer {a.key}"} if a.key else {}
    params = {k: v for k, v in (query or {}).items() if v is not None}
    if a.command == "consumers-set" and not body:
        print("mqgw admin consumers set: nothing to change (give at least one option; see --help)",
              file=sys.stderr)
        return 2
    try:
        r = httpx.request(method, a.url.rstrip("/") + path, json=body, params=params,
                          headers=headers, timeout=a.timeout)
    except httpx.HTTPError as e:
        print(f"mqgw admin: cannot reach {a.url}: {e}", file=sys.stderr)
        return 2
    try:
        out = json.dumps(r.json(), indent=2, sort_keys=False)
    except ValueError:
        out = r.text
    if r.is_success:
        table = None if getattr(a, "json", False) else render(a.command, _json(r))
        print(table if table is not None else out)
        if isinstance(data := _json(r), dict) and data.get("created") is True:
            print(f"mqgw admin: consumer {data.get('consumer')!r} was unknown (never registered, "
                  "seen or given settings): this call created it. Check the name.", file=sys.stderr)
        return 0
    print(f"HTTP {r.status_code}\n{out}", file=sys.stderr)
    return 1


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def bootstrap_key(a: argparse.Namespace) -> int:
    """Create an admin key straight in Redis (settings as the gateway reads them)."""
    from ..api.admin_wire import key_body
    from ..config import Settings, redact_url
    from ..core.auth import KeyStore
    from ..store import UNAVAILABLE, OffsetStore

    settings = Settings.load()

    async def create() -> tuple[str, Any]:
        store = OffsetStore.connect(settings.redis_url, settings.key_prefix)
        try:
            created = await KeyStore(store).create(a.name, admin=True)
            # Written to Redis only: the gateway's processes copy it to the registry's durable
            # copy in the broker within a second (core/registry_copy.py).
            await store.registry_copy.drop_copy_marker()
            return created
        finally:
            await store.aclose()

    try:
        key, rec = asyncio.run(create())
    except UNAVAILABLE as e:
        print(f"mqgw keys bootstrap: cannot reach Redis at {redact_url(settings.redis_url)}: {e}\n"
              "Set MQGW_REDIS_URL to the gateway's Redis (mqgw dev prints it).", file=sys.stderr)
        return 2
    print(json.dumps({**key_body(rec), "key": key}, indent=2))
    print("Store this key now: only its SHA-256 is kept.", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="create the first admin key directly in Redis")
    ks = keys.add_subparsers(dest="keys_cmd", required=True)
    b = ks.add_parser("bootstrap", help="create an admin key (reads MQGW_REDIS_URL, MQGW_KEY_PREFIX)")
    b.add_argument("--name", default="bootstrap-admin")
    b.set_defaults(fn=bootstrap_key)

    adm = sub.add_parser("admin", help="call the admin API of a running gateway")
    adm.add_argument("--url", default=os.environ.get("MQGW_URL", "http://127.0.0.1:8080"))
    adm.add_argument("--key", default=os.environ.get("MQGW_ADMIN_KEY", ""))
    adm.add_argument("--timeout", type=float, default=30.0)
    cmds = adm.add_subparsers(dest="group_cmd", required=True)

    def cmd(parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str, command: str,
            help: str, with_name: bool = True) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help)
        if with_name:
            p.add_argument("name")
        if command.endswith("-list"):
            p.add_argument("--json", action="store_true", help="the API's JSON, not a table")
        p.set_defaults(fn=run_admin, command=command)
        return p

    def consumer_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--topic", action="append", help="repeat for several topics")
        p.add_argument("--mode", choices=("cluster", "broadcast"))
        p.add_argument("--timeout-ms", type=int, help="consume (lock) timeout")
        p.add_argument("--max-batch", type=int)
        p.add_argument("--start", choices=("earliest", "latest"))
        p.add_argument("--rate", type=float, help="rate limit, messages per second (all nodes together)")
        p.add_argument("--burst", type=int)
        p.add_argument("--no-rate-limit", action="store_true")
        p.add_argument("--alert-backlog", type=int, help="alert when the backlog exceeds this many messages")
        p.add_argument("--alert-age-ms", type=int, help="alert when the oldest unconsumed message is older")
        p.add_argument("--retry-delays-ms", help="delay before each retry, e.g. 10000,30000,60000")
        p.add_argument("--retry-max-attempts", type=int, help="deliveries in all, the first included")
        p.add_argument("--dead-letter-topic", help="where records go after the last attempt")
        p.add_argument("--shards", type=int, help="Redis Cluster slots its offsets spread over "
                       "(1-16; fixed while it has offsets)")

    cons = cmds.add_parser("consumers", help="registered consumers").add_subparsers(dest="c", required=True)
    cmd(cons, "list", "consumers-list", "all consumers", with_name=False)
    cmd(cons, "get", "consumers-get", "one consumer")
    consumer_opts(cmd(cons, "register", "consumers-register", "register (or replace) a consumer"))
    consumer_opts(cmd(cons, "set", "consumers-set", "change some settings"))
    cmd(cons, "unregister", "consumers-unregister", "unregister").add_argument(
        "--delete-offsets", action="store_true")
    cmd(cmds, "pause", "pause", "pause a consumer: /message answers 'paused'")
    cmd(cmds, "resume", "resume", "resume a paused consumer at its committed offsets")
    r = cmd(cmds, "reset", "reset", "move committed offsets")
    r.add_argument("--topic", required=True)
    r.add_argument("--to", required=True, choices=("earliest", "latest", "timestamp", "offset"))
    r.add_argument("--timestamp", type=int, help="ms since the epoch (--to timestamp)")
    r.add_argument("--offset", type=int, help="with --queue (--to offset)")
    r.add_argument("--queue")
    r.add_argument("--client-id", help="one broadcast clientId, or '*' for all")
    r.add_argument("--dry-run", action="store_true",
                   help="move nothing: show where each queue is and where the reset would move it")

    dl = cmd(cmds, "dead-letters", "dead-letters", "count, age and a page of a consumer's dead letters")
    dl.add_argument("--limit", type=int)
    dl.add_argument("--partition", type=int)
    dl.add_argument("--offset", type=int, help="with --partition: start here")
    rd = cmd(cmds, "redrive", "redrive", "send a consumer's dead letters back (all, or a range "
             "from the oldest)")
    rd.add_argument("--target", choices=("consumer", "topic"),
                    help="consumer (default): its retry topic; topic: the topic it came from")
    rd.add_argument("--partition", type=int)
    rd.add_argument("--to-offset", type=int, help="stop below this offset")
    rd.add_argument("--limit", type=int, help="send at most this many")

    prod = cmds.add_parser("producers", help="registered producers").add_subparsers(dest="c", required=True)
    cmd(prod, "list", "producers-list", "all producers", with_name=False)
    cmd(prod, "get", "producers-get", "one producer")
    cmd(prod, "register", "producers-register", "register a producer").add_argument(
        "--topic", action="append", required=True)
    cmd(prod, "unregister", "producers-unregister", "unregister a producer")

    tc = cmds.add_parser("topics", help="the broker's topics").add_subparsers(dest="c", required=True)
    cmd(tc, "list", "topics-list", "topics with their partitions and offsets (not the gateway's "
        "or the broker's own)", with_name=False).add_argument(
        "--internal", action="store_true", help="also the gateway's (delay, retry) and the broker's topics")
    cmd(tc, "describe", "topics-describe", "one topic: partitions, replicas and offsets")
    tcr = cmd(tc, "create", "topics-create", "create a topic")
    tcr.add_argument("--partitions", type=int, required=True)
    tcr.add_argument("--replication-factor", type=int,
                     help="copies of each partition (default: the broker's default.replication.factor)")

    kc = cmds.add_parser("keys", help="API keys").add_subparsers(dest="c", required=True)
    cmd(kc, "list", "keys-list", "all keys (never their secrets)", with_name=False)
    k = cmd(kc, "create", "keys-create", "create a key; its secret is printed once")
    k.add_argument("--admin", action="store_true")
    k.add_argument("--producer", action="append", default=[])
    k.add_argument("--consumer", action="append", default=[])
    cmd(kc, "revoke", "keys-revoke", "revoke a key by id")

    bl = cmd(cmds, "backlog", "backlog", "backlog and oldest-message age per consumer and queue",
             with_name=False)
    bl.add_argument("--consumer", action="append")
    bl.add_argument("--no-age", action="store_true", help="skip the broker look-ups for ages")
    cmd(cmds, "alerts", "alerts", "firing backlog alerts", with_name=False).add_argument(
        "--all", action="store_true")
