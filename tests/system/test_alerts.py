"""Backlog view and backlog alerts, against real Redis, the real broker and gateway processes.

Records are produced with ``Api.produce_exact`` (one per request on Tansu, whose ListOffsets
under-reports the end of multi-record batches), and these tests assert exact backlogs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.api.registry_wire import consumer_fields
from gateway.broker.memory import MemoryBroker
from gateway.config import Settings
from gateway.core.auth import Authorizer, KeyStore
from gateway.core.consume import ConsumeService
from gateway.core.fetch import FetchParams
from gateway.core.registry import Registry
from gateway.core.requestid import RequestIdCodec
from gateway.core.watermarks import Watermarks
from gateway.ops import backlog
from gateway.ops.alerts import AlertMonitor
from gateway.store import OffsetStore, now_ms

from ..support import Api, Node, start_node, unique


class Receiver:
    """A webhook receiver on loopback that keeps every JSON body POSTed to it."""

    def __init__(self, fail_first: int = 0, fail_status: int = 503) -> None:
        self.posts: list[dict[str, Any]] = []
        self.attempts = 0
        self.fail_first = fail_first
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    outer.attempts += 1
                    failing = outer.attempts <= outer.fail_first
                    if not failing:
                        outer.posts.append(json.loads(body))
                self.send_response(fail_status if failing else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self, consumer: str) -> list[dict[str, Any]]:
        return [p for p in list(self.posts) if p.get("consumer") == consumer]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def produce_each(api: Api, topic: str, partition: int, n: int, tag: str = "v") -> None:
    api.produce_exact(topic, [f"{tag}{i}" for i in range(n)], partition=partition)


def consume(api: Api, node: int | None = None, ack: bool = True, **params: Any) -> dict[str, Any]:
    body = api.message(node, **params).json()
    assert body["status"] == "ok", body
    if ack:
        assert api.ack(body["requestId"]).json()["result"] == "committed"
    return body


def backlog_of(api: Api, group: str, node: int | None = None, **params: Any) -> dict[str, Any]:
    r = api.http.get(api.url("/admin/backlog", node), params={"consumer": group, **params})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["generatedMs"] > 0 and [c["consumer"] for c in body["consumers"]] == [group]
    return body["consumers"][0]


def alerts(api: Api, node: int | None = None, evaluate: bool = False) -> dict[str, Any]:
    if evaluate:
        r = api.http.post(api.url("/admin/alerts/evaluate?all=true", node))
    else:
        r = api.http.get(api.url("/admin/alerts", node), params={"all": "true"})
    assert r.status_code == 200, r.text
    return r.json()


def state_of(api: Api, group: str, node: int | None = None) -> dict[str, Any] | None:
    return next((s for s in alerts(api, node)["all"] if s["consumer"] == group), None)


def scrape(api: Api, node: int) -> str:
    """The node's /metrics text."""
    r = api.http.get(api.url("/metrics", node))
    assert r.status_code == 200, r.text
    return r.text


@pytest.mark.timeout(90)
def test_backlog_view_of_a_cluster_consumer(node_factory, make_topic) -> None:
    api = Api([node_factory().url])
    try:
        topic, g = make_topic(3), unique()
        api.config(g, start="earliest")
        produced = {"0": 5, "1": 3, "2": 0}
        for q, n in produced.items():
            produce_each(api, topic, int(q), n)
        committed = dict.fromkeys(produced, 0)
        for _ in range(2):  # two acked batches of 2
            b = consume(api, consumer=g, topic=topic, max=2)
            committed[b["queue"]] += 2
        held = consume(api, ack=False, consumer=g, topic=topic, max=1)  # locked, not acked

        c = backlog_of(api, g)
        assert (c["mode"], c["registered"], c["paused"], c["clients"]) == ("cluster", False, False, [])
        rows = {r["queue"]: r for r in c["queues"]}
        assert sorted(rows) == ["0", "1", "2"]
        for q, r in rows.items():
            assert r["clientId"] is None and r["topic"] == topic
            assert (r["maxOffset"], r["committedOffset"], r["backlog"]) == (
                produced[q], committed[q], produced[q] - committed[q]), r
            assert (r["lockAgeMs"] is not None) == (q == held["queue"])
            assert (r["oldestAgeMs"] is not None) == (r["backlog"] > 0)
        assert c["totalBacklog"] == 8 - sum(committed.values()) == 4
        assert 0 <= c["oldestAgeMs"] < 60_000

        # more records show up in the view without anyone consuming
        produce_each(api, topic, 2, 2, tag="late")
        c = wait_for(lambda: (x := backlog_of(api, g, age="false"))["totalBacklog"] == 6 and x,
                     what="new records in the backlog")
        assert c["oldestAgeMs"] is None and all(r["oldestAgeMs"] is None for r in c["queues"])

        # the list without a filter holds it too; a bad flag is refused
        every = api.http.get(api.url("/admin/backlog"), params={"age": "false"}).json()["consumers"]
        assert g in [x["consumer"] for x in every]
        assert api.http.get(api.url("/admin/backlog"), params={"age": "maybe"}).status_code == 400
    finally:
        api.http.close()


@pytest.mark.timeout(90)
def test_backlog_view_of_a_broadcast_consumer(node_factory, make_topic) -> None:
    api = Api([node_factory().url])
    try:
        topic, g = make_topic(2), unique()
        api.config(g, start="earliest")
        produce_each(api, topic, 0, 4)
        produce_each(api, topic, 1, 2)
        # c1 reads all of queue 0; c2 reads one record of queue 0
        b = consume(api, consumer=g, clientId="c1", topic=topic, max=10)
        assert b["queue"] == "0" and len(b["messages"]) == 4
        b = consume(api, consumer=g, clientId="c2", topic=topic, max=1)
        assert b["queue"] == "0"

        c = backlog_of(api, g)
        assert c["mode"] == "broadcast"
        per_client = {x["clientId"]: x["totalBacklog"] for x in c["clients"]}
        assert per_client == {"c1": 2, "c2": 5}
        assert c["totalBacklog"] == 5  # the slowest clientId
        rows = {(r["clientId"], r["queue"]): (r["committedOffset"], r["backlog"]) for r in c["queues"]}
        assert rows == {("c1", "0"): (4, 0), ("c1", "1"): (0, 2),
                        ("c2", "0"): (1, 3), ("c2", "1"): (0, 2)}
        assert all(x["lastSeenMs"] > 0 and x["oldestAgeMs"] is not None for x in c["clients"])
    finally:
        api.http.close()


@pytest.mark.timeout(60)
def test_oldest_age_is_the_age_of_the_first_unconsumed_record(node_factory, make_topic) -> None:
    api = Api([node_factory().url])
    try:
        topic, g = make_topic(1), unique()
        api.config(g, start="earliest")
        produce_each(api, topic, 0, 1, tag="done")
        before = time.time() * 1000
        produce_each(api, topic, 0, 2, tag="waiting")
        consume(api, consumer=g, topic=topic, max=1)  # commits offset 0: offset 1 is the oldest
        time.sleep(1.1)
        c = backlog_of(api, g)
        upper = time.time() * 1000 - before + 50  # 50 ms of slack for clock rounding
        assert c["totalBacklog"] == 2
        assert 1000 <= c["oldestAgeMs"] <= upper, (c["oldestAgeMs"], upper)
        assert c["queues"][0]["oldestAgeMs"] == c["oldestAgeMs"]
        consume(api, consumer=g, topic=topic, max=10)
        c = backlog_of(api, g)
        assert (c["totalBacklog"], c["oldestAgeMs"]) == (0, 0)
    finally:
        api.http.close()


@pytest.mark.slow  # two nodes, and 2.5 s of watching that nothing more is sent
@pytest.mark.timeout(90)
def test_backlog_alert_fires_once_across_two_nodes_and_resolves(node_factory, make_topic,
                                                               receiver: Receiver) -> None:
    # A key prefix of their own: the session's other nodes run alert monitors too (with the
    # default 15 s interval, so their lease would starve these nodes' 300 ms one).
    prefix = unique("alerts")
    nodes = [node_factory(alert_interval_ms=300, alert_webhook_url=receiver.url, key_prefix=prefix)
             for _ in range(2)]
    api = Api([n.url for n in nodes])
    try:
        topic, g = make_topic(1), unique()
        api.config(g, start="earliest", alerts={"backlogMessages": 3})
        produce_each(api, topic, 0, 2)
        consume(api, 0, consumer=g, topic=topic, max=1)  # backlog 1: below the threshold
        ok = wait_for(lambda: (s := state_of(api, g, 1)) and s, what="an ok state")
        assert ok["state"] == "ok" and ok["reasons"] == [] and ok["thresholds"] == {"backlogMessages": 3}

        produce_each(api, topic, 0, 3, tag="more")  # backlog 4
        firing = wait_for(lambda: [a for a in alerts(api, 0)["alerts"] if a["consumer"] == g],
                          what="the alert to fire")[0]
        assert (firing["state"], firing["reasons"], firing["totalBacklog"]) == ("firing", ["backlog"], 4)
        wait_for(lambda: receiver.events(g), what="the firing webhook")
        time.sleep(1.5)  # several intervals: both nodes' monitors keep evaluating
        events = receiver.events(g)
        assert len(events) == 1, events
        assert events[0] == {"event": "firing", "consumer": g, "reasons": ["backlog"], "totalBacklog": 4,
                             "oldestAgeMs": None, "thresholds": {"backlogMessages": 3},
                             "since": firing["since"], "gateway": "mq-gateway"}
        assert state_of(api, g, 1)["since"] == firing["since"]  # still the same firing alert

        for i in range(2):
            text = scrape(api, i)
            assert f'mqgw_backlog_alert{{consumer="{g}"}} 1.0' in text
            assert f'mqgw_consumer_backlog{{consumer="{g}"}} 4.0' in text

        consume(api, 1, consumer=g, topic=topic, max=10)  # drain
        wait_for(lambda: len(receiver.events(g)) == 2, what="the resolved webhook")
        resolved = receiver.events(g)[1]
        assert (resolved["event"], resolved["reasons"], resolved["totalBacklog"]) == (
            "resolved", ["backlog"], 0)
        time.sleep(1.0)
        assert len(receiver.events(g)) == 2
        s = state_of(api, g, 0)
        assert s["state"] == "ok" and s["totalBacklog"] == 0
        assert g not in [a["consumer"] for a in alerts(api)["alerts"]]
        assert f'mqgw_backlog_alert{{consumer="{g}"}} 0.0' in scrape(api, 1)
    finally:
        api.http.close()


@pytest.mark.slow  # two nodes, one a relay, and a delayed record left 2 s past its time
@pytest.mark.timeout(120)
def test_the_delay_wheels_alert_fires_while_no_relay_runs_and_resolves_once_one_does(
        node_factory, make_topic, receiver: Receiver) -> None:
    """With no relay anywhere a delayed record waits in its level topic and nothing said so (a
    console test's retries waited so for minutes). The relay consumer's built-in alert fires
    once the record is past its time by ``delay_overdue_alert_ms``, and resolves once a relay
    moved it. Real Kafka: the head's wheel headers are read from the level topic."""
    relay = "_mqgw.relay"
    common = dict(key_prefix=unique("wheel"), delay_levels="1s,10s",
                  delay_topic_prefix=f"{unique('lv')}.", alert_interval_ms=300,
                  delay_overdue_alert_ms=500, alert_webhook_url=receiver.url)
    node = node_factory(**common)  # no relay (tests/support node_env)
    api = Api([node.url])
    try:
        topic, g = make_topic(1), unique()
        api.config(g, start="earliest")
        r = api.http.post(api.url("/produce"), json={"topic": topic, "value": "late", "delayMs": 1500})
        assert r.status_code == 200, r.text
        firing = wait_for(lambda: [a for a in alerts(api, 0)["alerts"] if a["consumer"] == relay],
                          timeout=60, what="the wheel's alert")[0]
        assert firing["reasons"] == ["overdue"] and firing["totalBacklog"] == 1, firing
        assert firing["oldestAgeMs"] >= 500 and firing["thresholds"] == {"overdueMs": 500}, firing
        wait_for(lambda: receiver.events(relay), what="its webhook")
        assert f'mqgw_backlog_alert{{consumer="{relay}"}} 1.0' in scrape(api, 0)
        assert api.message(consumer=g, topic=topic).json()["status"] == "empty"  # still waiting
        node_factory(relay="true", **common)  # a relay comes: the record moves on
        assert consume(api, 0, consumer=g, topic=topic, wait_ms=30_000)["messages"][0]["value"] == "late"
        resolved = wait_for(lambda: receiver.events(relay)[1:], timeout=30, what="resolved")[0]
        assert resolved["event"] == "resolved" and resolved["reasons"] == ["overdue"], resolved
        assert (state_of(api, relay, 0) or {}).get("state") == "ok"
    finally:
        api.http.close()


@pytest.mark.slow  # two nodes, and a record aged past 2 s
@pytest.mark.timeout(90)
def test_age_alert_with_a_failing_webhook_then_thresholds_removed(node_factory, make_topic) -> None:
    receiver = Receiver(fail_first=1)  # the first attempt gets a 503: the gateway retries
    try:
        # No periodic evaluation (interval 0): only the explicit ones below run.
        prefix = unique("alerts")
        nodes = [node_factory(alert_interval_ms=0, alert_webhook_url=receiver.url, key_prefix=prefix)
                 for _ in range(2)]
        api = Api([n.url for n in nodes])
        topic, g = make_topic(1), unique()
        # The first evaluation must see an age below the threshold, however slow a loaded machine
        # is to get there (its broker read on a fresh node is part of the age it measures): it
        # runs with a 60 s threshold. Thresholds are read at each evaluation, so the 2 s one set
        # afterwards is the one the alert then fires on, as the record ages past it.
        api.config(g, start="earliest", alerts={"oldestAgeMs": 60_000})
        produce_each(api, topic, 0, 2)
        # after the produce answered: the records' timestamps are no later than this (taken
        # before it, a loaded machine's slow produce left the record younger than 2 s below)
        produced_at = time.monotonic()
        consume(api, 0, consumer=g, topic=topic, max=1)
        s = next(x for x in alerts(api, 1, evaluate=True)["all"] if x["consumer"] == g)
        assert s["state"] == "ok" and 0 <= s["oldestAgeMs"] < 60_000, s
        api.config(g, alerts={"oldestAgeMs": 2000})

        time.sleep(max(0.0, produced_at + 2.1 - time.monotonic()))
        # both nodes evaluate at once: the lock serializes them, one transition, one webhook
        with httpx.Client(timeout=60) as h:
            results: list[httpx.Response] = []
            threads = [threading.Thread(target=lambda n=n: results.append(
                h.post(n.url + "/admin/alerts/evaluate"))) for n in nodes]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert [r.status_code for r in results] == [200, 200]
        body = results[0].json()
        assert set(body) == {"alerts", "evaluatedMs"}
        firing = next(a for a in body["alerts"] if a["consumer"] == g)
        assert firing["reasons"] == ["age"] and firing["oldestAgeMs"] >= 2000
        wait_for(lambda: receiver.events(g), timeout=10, what="the webhook after a retry")
        assert receiver.attempts >= 2
        time.sleep(0.5)
        assert [e["event"] for e in receiver.events(g)] == ["firing"]
        assert receiver.events(g)[0]["reasons"] == ["age"]

        # removing the thresholds resolves the alert and forgets the consumer's alert state
        api.config(g, alerts=None)
        alerts(api, 0, evaluate=True)
        wait_for(lambda: len(receiver.events(g)) == 2, what="the resolved webhook")
        assert receiver.events(g)[1]["event"] == "resolved"
        assert state_of(api, g) is None
        api.http.close()
    finally:
        receiver.close()


@pytest.mark.slow  # Redis Cluster
@pytest.mark.timeout(120)
def test_backlog_and_alerts_on_redis_cluster(redis_cluster: Any, bootstrap: str, make_topic, tmp_path,
                                             receiver: Receiver) -> None:
    nodes: list[Node] = []
    try:
        nodes = [start_node(redis_cluster.url, bootstrap, tmp_path, alert_interval_ms=300,
                            alert_webhook_url=receiver.url) for _ in range(2)]
        api = Api([n.url for n in nodes])
        topic = make_topic(1)
        groups = [unique() for _ in range(6)]  # spread over all three masters' slots
        produce_each(api, topic, 0, 3)
        expected = {}
        for i, g in enumerate(groups):
            api.config(g, start="earliest")
            if i % 3 == 0:  # broadcast, fetched but not acked: all 3 records still count
                consume(api, ack=False, consumer=g, clientId="c", topic=topic, max=1)
                expected[g] = 3
            else:  # cluster, 1 or 2 records acked
                consume(api, consumer=g, topic=topic, max=i % 3)
                expected[g] = 3 - i % 3
            # only now, so that no evaluation sees the backlog of 3 before the ack
            api.config(g, alerts={"backlogMessages": 3})
        body = api.http.get(api.url("/admin/backlog")).json()
        got = {c["consumer"]: c for c in body["consumers"]}
        assert {g: got[g]["totalBacklog"] for g in groups} == expected
        assert all(got[g]["oldestAgeMs"] is not None for g in groups)
        want = {g for g, n in expected.items() if n >= 3}
        wait_for(lambda: want <= {a["consumer"] for a in alerts(api)["alerts"]},
                 what="alerts on cluster")
        wait_for(lambda: all(receiver.events(g) for g in want), what="webhooks on cluster")
        time.sleep(1.0)
        assert all(len(receiver.events(g)) == 1 for g in want)
        assert not any(receiver.events(g) for g in set(groups) - want)
        api.http.close()
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.timeout(60)
def test_ages_retention_broker_errors_and_gauges_in_process(redis_url: str) -> None:
    """One process, the in-memory broker: ages past retention, a failing broker, the gauges."""
    b = MemoryBroker()
    b.create("orders", 2)
    b.append("orders", "0", *"abcde")
    b.append("orders", "1", "x", "y")
    now = now_ms()
    for off, rec in b.logs["orders"]["0"].items():
        rec.timestamp = now - 9000 + 1000 * off  # offset 2: 7 s old, offset 4: 5 s old
    for rec in b.logs["orders"]["1"].values():
        rec.timestamp = now - 2000

    async def main() -> None:
        r = aioredis.Redis.from_url(redis_url)
        try:
            store = OffsetStore(r, unique("p"))  # a private key prefix
            settings = Settings(start_position="earliest", open_mode=True, auth=False,
                                alert_interval_ms=0, metadata_refresh_ms=50)
            svc = ConsumeService(settings, store, b, Watermarks(store, b, 50), RequestIdCodec("k"),
                                 Authorizer(False, KeyStore(store)))
            gw = SimpleNamespace(settings=settings, redis=r, store=store, broker=b,
                                 registry=Registry(store, settings))
            g = unique()
            got = (await svc.fetch(FetchParams(g, "", "orders", 2, 0, "test"))).batch
            assert got is not None and got.queue == "0"
            assert (await svc.ack(got.request_id)).result == "committed"

            # An age is the time since `now` plus what the record was given: bounded by the
            # clock read after each collect, never by how fast a (loaded) machine gets there.
            [c] = await backlog.collect(gw)
            since = now_ms() - now
            assert (c["consumer"], c["totalBacklog"]) == (g, 5)
            ages = {q["queue"]: q["oldestAgeMs"] for q in c["queues"]}
            assert 7000 <= ages["0"] <= 7000 + since and 2000 <= ages["1"] <= 2000 + since, (ages, since)
            assert c["oldestAgeMs"] == ages["0"]

            b.delete_before("orders", "0", 4)  # the committed offset 2 fell out of retention
            [c] = await backlog.collect(gw, [g])
            since = now_ms() - now
            assert 5000 <= c["oldestAgeMs"] <= 5000 + since, (c["oldestAgeMs"], since)

            async def broken(*args: Any) -> Any:
                raise RuntimeError("broker down")
            real_fetch, b.fetch = b.fetch, broken  # type: ignore[method-assign]
            [c] = await backlog.collect(gw, [g])
            assert c["totalBacklog"] == 5 and c["oldestAgeMs"] is None  # unknown, not an error

            async def hanging(*args: Any) -> Any:  # a broker that accepts and never answers
                await asyncio.sleep(3600)
            b.fetch = hanging  # type: ignore[method-assign]
            budget, timeout = backlog.PEEK_BUDGET_S, backlog.PEEK_TIMEOUT_S
            backlog.PEEK_BUDGET_S = 0.3
            backlog.PEEK_TIMEOUT_S = 30.0  # without the budget, collect would wait 30 s for a peek
            try:
                t0 = time.monotonic()
                [c] = await backlog.collect(gw, [g])
                # the budget ended it: well under the 30 s a peek would wait (10 s of room for a
                # loaded machine)
                assert time.monotonic() - t0 < 10 and c["oldestAgeMs"] is None
            finally:
                backlog.PEEK_BUDGET_S, backlog.PEEK_TIMEOUT_S = budget, timeout
            b.fetch = real_fetch  # type: ignore[method-assign]

            mon = AlertMonitor(gw.settings, gw.store, gw.broker, gw.registry)
            await gw.registry.patch_consumer(g, consumer_fields({"alerts": {"backlogMessages": 4}}))
            await mon.evaluate_now()
            view = await mon.view(include_all=True)
            assert [(a["consumer"], a["reasons"]) for a in view["alerts"]] == [(g, ["backlog"])]
            assert view["evaluatedMs"] >= now

            def samples(families: list[Any]) -> dict[str, float]:
                return {f"{s.name}:{s.labels['consumer']}": s.value for f in families for s in f.samples}
            m = samples(await mon.collect_metrics())
            assert (m[f"mqgw_consumer_backlog:{g}"], m[f"mqgw_backlog_alert:{g}"]) == (5, 1)
            assert f"mqgw_consumer_oldest_age_seconds:{g}" not in m  # no age threshold: not measured

            await gw.registry.patch_consumer(
                g, consumer_fields({"alerts": {"backlogMessages": 100, "oldestAgeMs": 60_000}}))
            await mon.evaluate_now()
            m = samples(await mon.collect_metrics())
            since = now_ms() - now
            assert m[f"mqgw_backlog_alert:{g}"] == 0
            assert 5 <= m[f"mqgw_consumer_oldest_age_seconds:{g}"] <= 5 + since / 1000, (m, since)
            assert (await mon.view())["alerts"] == []

            # unregistering a firing consumer resolves its alert and forgets it
            sent: list[dict[str, Any]] = []
            mon._post_later = sent.append  # type: ignore[method-assign]
            await gw.registry.patch_consumer(g, consumer_fields({"alerts": {"backlogMessages": 1}}))
            await mon.evaluate_now()
            await gw.registry.delete_consumer(g, delete_offsets=False)
            await mon.evaluate_now()
            assert [(e["event"], e["reasons"]) for e in sent] == [
                ("firing", ["backlog"]), ("resolved", ["backlog"])]
            assert (await mon.view(include_all=True))["all"] == []
            m = samples(await mon.collect_metrics())
            assert not any(k.endswith(f":{g}") for k in m)
            await mon.stop()
        finally:
            await r.aclose()

    asyncio.run(main())


def test_evaluations_on_two_nodes_never_overlap(redis_url: str) -> None:
    """Two monitors sharing Redis (two nodes): evaluations asked for at once run one after the
    other, each seeing the state the other committed, so one transition sends one webhook."""
    async def main() -> None:
        r = aioredis.Redis.from_url(redis_url)
        try:
            store = OffsetStore(r, unique("p"))
            settings = Settings(alert_interval_ms=0, open_mode=True, auth=False)
            gw = SimpleNamespace(settings=settings, redis=r, store=store, broker=MemoryBroker(),
                                 registry=Registry(store, settings))
            running, most, runs = [0], [0], [0]

            async def slow(self: AlertMonitor, token: str) -> None:
                running[0] += 1
                most[0] = max(most[0], running[0])
                await asyncio.sleep(0.3)  # long enough for the other node's call to arrive
                running[0] -= 1
                runs[0] += 1

            monitors = [AlertMonitor(gw.settings, gw.store, gw.broker, gw.registry) for _ in range(2)]
            for m in monitors:
                m._evaluate = slow.__get__(m)  # type: ignore[method-assign]
            t0 = time.monotonic()
            await asyncio.gather(*(m.evaluate_now() for m in monitors))
            assert runs[0] == 2 and most[0] == 1  # both ran, never at the same time
            assert time.monotonic() - t0 >= 0.6
            assert not await r.exists(monitors[0].key("lock"))  # released
        finally:
            await r.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("fail_first, fail_status, attempts, delivered", [
    (3, 503, 4, True),    # three retries, the fourth attempt gets through
    (9, 503, 4, False),   # then it gives up
    (9, 429, 4, False),   # 429 and 408 are worth retrying too
    (9, 400, 1, False),   # the receiver refuses it: no retry
])
def test_webhook_retries_with_backoff(monkeypatch, fail_first: int, fail_status: int,
                                      attempts: int, delivered: bool) -> None:
    from gateway.ops import alerts as alerts_mod

    monkeypatch.setattr(alerts_mod, "WEBHOOK_BACKOFF_S", 0.02)
    receiver = Receiver(fail_first=fail_first, fail_status=fail_status)
    settings = Settings(alert_interval_ms=0, alert_webhook_url=receiver.url)

    async def main() -> float:
        mon = AlertMonitor(settings, None, None, None)  # type: ignore[arg-type]  # posts only
        t0 = time.monotonic()
        try:
            await mon._post({"event": "firing", "consumer": "c", "reasons": ["backlog"]})
        finally:
            await mon._http.aclose()
        return time.monotonic() - t0

    try:
        took = asyncio.run(main())
        assert receiver.attempts == attempts
        assert [p["consumer"] for p in receiver.posts] == (["c"] if delivered else [])
        if attempts == 4:  # backoff doubles: 0.02 + 0.04 + 0.08 s between the four attempts
            assert took >= 0.14
    finally:
        receiver.close()
