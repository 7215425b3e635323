"""A broker fenced by its KRaft controller for a moment, then back: every node serves again
within seconds, by itself (issue 32, ``make chaos``).

Seen four times on loaded machines: the single broker missed its heartbeats, the controller
fenced it, and from then on every node answered 503 ``Failed to get metadata: Local: Broker
transport failure`` until it was restarted (13-37 minutes), while a fresh client got metadata at
once. The window is the moment after the broker comes back in which it serves metadata that
lists no live broker; with ``metadata.recovery.strategy=none`` librdkafka then forgets the only
broker it knew and never goes back to ``bootstrap.servers``.

Made deterministic here: a controller and a broker in processes of their own
(kafka_dist.start_split; a combined node cannot fence itself), the broker SIGSTOPped until the
controller logs that it fenced it, then SIGCONT, three times, with clients calling the node
throughout. Apache Kafka only: the harness starts its own Kafka from the jars.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.cli import devstack

from ..support import TEST_BROKER, TLS, Node, serves, start_node, unique, wait_for
from ..support.slow_proxy import SlowProxy

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.skipif(
    TEST_BROKER != "kafka" or bool(os.environ.get("KAFKA_BOOTSTRAP")),
    reason="starts a controller and a broker of Apache Kafka from its jars (the Kafka pass)")]

FENCINGS = 3
#: How soon a node must serve again once the broker does (issue 32: within 10 s). Counted from
#: the moment a fresh client sees the broker in metadata again, so a slow machine's restart of
#: the broker itself is not counted against the node.
RECOVERY_S = 10.0


@pytest.fixture
def split() -> Iterator[object]:
    from gateway.cli.kafka_dist import start_split

    k = start_split()
    try:
        yield k
    finally:
        k.stop()


def _fencings(log: str) -> int:
    return Path(log).read_text(errors="replace").count("Fencing broker 2 ")


def _brokerserves(bootstrap: str, topic: str) -> bool:
    """A fresh client's view: the broker is listed and leads the topic's partitions."""
    from confluent_kafka.admin import AdminClient

    try:
        md = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(topic, timeout=2)
    except Exception:  # noqa: BLE001 - not yet
        return False
    tm = md.topics.get(topic)
    return bool(md.brokers) and tm is not None and tm.error is None and bool(tm.partitions) \
        and all(p.leader == 2 for p in tm.partitions.values())


class Traffic:
    """Clients calling the node all along (their metadata look-ups are what the broker's first
    answers after SIGCONT reach); what they got is counted: an outage is 503 (or a slow answer),
    never 404 (before: ``404 unknown_topic`` for the existing topic, which a client takes as
    "stop consuming")."""

    def __init__(self, node: Node, topic: str, group: str) -> None:
        self.statuses: dict[int, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(node, topic, group), daemon=True)
        self._t.start()

    def _run(self, node: Node, topic: str, group: str) -> None:
        with httpx.Client(timeout=15, verify=TLS) as http:
            while not self._stop.is_set():
                for call in (lambda: http.post(f"{node.url}/produce", json={"topic": topic, "value": "x"}),
                             lambda: http.get(f"{node.url}/message", params={
                                 "consumer": group, "topic": topic, "wait_ms": 200})):
                    try:
                        code = call().status_code
                    except httpx.HTTPError:
                        code = 0
                    self.statuses[code] = self.statuses.get(code, 0) + 1
                    if code == 200:  # the (unacked) batch's lock is short; keep the loop light
                        self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(30)


def test_nodes_serve_again_after_their_broker_was_fenced(split: object, redis_url: str,
                                                         tmp_path: Path) -> None:
    from gateway.cli.kafka_dist import SplitKafka

    assert isinstance(split, SplitKafka)
    topic = unique("fenced")
    devstack.create_topic(split.bootstrap, topic, 2)
    # the product's librdkafka settings (no kafka_config): what a deployment runs
    node = start_node(redis_url, split.bootstrap, tmp_path, start_position="earliest",
                      consume_timeout_ms=1000)
    group = unique("fenced")
    recoveries: list[float] = []
    try:
        with httpx.Client(timeout=15, verify=TLS) as http:
            wait_for(lambda: serves(http, node, topic, group), "the node to serve", timeout=60)
            traffic = Traffic(node, topic, group)
            try:
                for _ in range(FENCINGS):
                    # Counted only once the broker serves (unfenced): on a loaded machine the
                    # controller may fence it by itself between two rounds, and a broker stopped
                    # while already fenced is not fenced again (no new log line: this wait once
                    # ran out at load 3 on 2 cores).
                    wait_for(lambda: _brokerserves(split.bootstrap, topic),
                             "the broker to serve before it is stopped", timeout=120)
                    fenced = _fencings(split.controller.extra["log"])
                    os.killpg(split.broker.proc.pid, signal.SIGSTOP)
                    try:  # stopped until the controller fenced it (its session: 2 s)
                        wait_for(lambda f=fenced: _fencings(split.controller.extra["log"]) > f,
                                 "the controller to fence the broker", timeout=120)
                    finally:
                        os.killpg(split.broker.proc.pid, signal.SIGCONT)
                    wait_for(lambda: _brokerserves(split.bootstrap, topic),
                             "the broker to serve again", timeout=120)
                    back = time.monotonic()
                    while not serves(http, node, topic, group):
                        waited = time.monotonic() - back
                        assert waited < RECOVERY_S, (
                            f"the node still fails {waited:.0f} s after the broker serves again "
                            f"(fencing {len(recoveries) + 1}); traffic: {traffic.statuses}\n"
                            f"{node.log.read_text()[-3000:]}")
                        time.sleep(0.2)
                    recoveries.append(time.monotonic() - back)
            finally:
                traffic.stop()
    finally:
        node.stop()
    assert 404 not in traffic.statuses and 500 not in traffic.statuses, traffic.statuses
    print(f"recovered after {', '.join(f'{r:.1f}' for r in recoveries)} s; "
          f"traffic statuses {traffic.statuses}")


def test_readyz_answers_and_says_why_while_broker_calls_hang(split: object, redis_url: str,
                                                              tmp_path: Path) -> None:
    """The broker SIGSTOPped (its calls hang until their timeouts) and requests filling the
    node's Kafka thread pool: ``/readyz`` still answers within its bound (2.5 s a check) and
    names the broker. Before: its ping queued behind the pool, no answer within 9-60 s."""
    from concurrent.futures import ThreadPoolExecutor

    from gateway.cli.kafka_dist import SplitKafka

    assert isinstance(split, SplitKafka)
    topics = [unique("hang") for _ in range(4)]
    for t in topics:
        devstack.create_topic(split.bootstrap, t, 4)
    node = start_node(redis_url, split.bootstrap, tmp_path)
    try:
        with httpx.Client(timeout=60, verify=TLS) as http:
            wait_for(lambda: http.get(f"{node.url}/readyz").status_code == 200, "ready", timeout=60)
            os.killpg(split.broker.proc.pid, signal.SIGSTOP)
            try:
                with ThreadPoolExecutor(48) as pool:  # more than the pool's 18 threads
                    def busy(i: int) -> int:
                        try:
                            return http.get(f"{node.url}/message", params={
                                "consumer": unique("g"), "topic": topics[i % len(topics)],
                                "wait_ms": 0}).status_code
                        except httpx.HTTPError:
                            return 0
                    calls = [pool.submit(busy, i) for i in range(48)]
                    time.sleep(1.0)  # the pool's threads are waiting on the stopped broker
                    t0 = time.monotonic()
                    # 8 s: the bound is 2.5 s; the margin is for a loaded machine, and the old
                    # code took 9-60 s
                    r = http.get(f"{node.url}/readyz", timeout=8)
                    took = time.monotonic() - t0
                    assert r.status_code == 503, r.text
                    body = r.json()
                    assert body["checks"] == {"redis": True, "broker": False}, body
                    assert body["reasons"]["broker"], body
                    codes = [c.result() for c in calls]
            finally:
                os.killpg(split.broker.proc.pid, signal.SIGCONT)
            assert 404 not in codes and 500 not in codes, codes  # a stopped broker is 503
            wait_for(lambda: http.get(f"{node.url}/readyz").status_code == 200, "ready again",
                     timeout=60)
    finally:
        node.stop()
    print(f"/readyz answered in {took:.1f} s: {body}")


def test_a_node_whose_broker_hangs_stops_within_10_s(split: object, redis_url: str,
                                                     tmp_path: Path) -> None:
    """SIGTERM while the broker is stopped: the producers' flush and the consumers' close wait
    for a broker that does not answer. Before: the stop hung 20-110 s in ``Clients.close``
    (``meta.close()`` on the event loop). Now both are bounded (5 s each, off the loop)."""
    from gateway.cli.kafka_dist import SplitKafka

    assert isinstance(split, SplitKafka)
    topic = unique("stop")
    devstack.create_topic(split.bootstrap, topic, 2)
    node = start_node(redis_url, split.bootstrap, tmp_path)
    try:
        with httpx.Client(timeout=30, verify=TLS) as http:
            wait_for(lambda: serves(http, node, topic, unique("g")), "the node to serve", timeout=60)
        os.killpg(split.broker.proc.pid, signal.SIGSTOP)
        try:
            with httpx.Client(timeout=2, verify=TLS) as http:  # work for the clients to hold
                for _ in range(3):
                    try:
                        http.post(f"{node.url}/produce", json={"topic": topic, "value": "held"})
                    except httpx.HTTPError:
                        pass
            t0 = time.monotonic()
            os.killpg(node.proc.pid, signal.SIGTERM)
            try:
                node.proc.wait(60)
            except Exception:  # noqa: BLE001 - reported below
                pass
            took = time.monotonic() - t0
        finally:
            os.killpg(split.broker.proc.pid, signal.SIGCONT)
    finally:
        node.stop()
    log = node.log.read_text()
    # measured 6.2 s (4 s drain, 2 s flush); 15 leaves a loaded machine room, the old hang was 20-110 s
    assert node.proc.returncode is not None and took < 15, f"the stop took {took:.0f} s\n{log[-3000:]}"
    assert "Traceback" not in log, log[-3000:]
    print(f"stopped in {took:.1f} s with the broker stopped")


def test_a_delayed_produce_is_answered_within_its_timeout_while_the_broker_hangs(
        split: object, redis_url: str, tmp_path: Path) -> None:
    """Before: a delayed ``/produce`` during an outage answered 503 only after 143-216 s with
    ``produce_timeout_ms`` at 30 s. Now the whole request is bounded by it plus 5 s."""
    from gateway.cli.kafka_dist import SplitKafka

    assert isinstance(split, SplitKafka)
    topic = unique("late")
    devstack.create_topic(split.bootstrap, topic, 2)
    node = start_node(redis_url, split.bootstrap, tmp_path, relay="true", produce_timeout_ms=2000,
                      delay_levels="1s,10s", delay_topic_prefix=f"{unique('wheel')}.")
    try:
        with httpx.Client(timeout=120, verify=TLS) as http:
            wait_for(lambda: http.post(f"{node.url}/produce", json={
                "topic": topic, "value": "x", "delayMs": 5000}).status_code == 200,
                "a delayed produce to work", timeout=60)
            os.killpg(split.broker.proc.pid, signal.SIGSTOP)
            try:
                answers = []
                for body in ({"topic": topic, "value": "late", "delayMs": 5000},
                             {"topic": topic, "value": "now"}):
                    t0 = time.monotonic()
                    r = http.post(f"{node.url}/produce", json=body)
                    answers.append((r.status_code, time.monotonic() - t0, r.text[:200]))
            finally:
                os.killpg(split.broker.proc.pid, signal.SIGCONT)
    finally:
        node.stop()
    for code, took, text in answers:
        # 2 s + 5 s of slack; 30 leaves a loaded machine room (before: 143-216 s at 30 s)
        assert took < 30, answers
        # a 503, or the broker's own timeout per record (200, failed); never a 500
        assert code == 503 or (code == 200 and '"failed":1' in text), answers
    print(f"answered {answers}")


@pytest.fixture
def relayed() -> Iterator[tuple[object, SlowProxy]]:
    """A split Kafka whose clients (those that bootstrap at the proxy) reach its broker only
    through a :class:`SlowProxy`."""
    from gateway.cli.kafka_dist import start_split

    port = devstack.free_port()
    k = start_split(relayed_port=port)
    proxy = SlowProxy(int(k.broker.extra["relayed"]), port)
    try:
        yield k, proxy
    finally:
        proxy.close()
        k.stop()


#: The slow broker's delay per answer: under the Kafka adapter's 5 s metadata timeout, so every
#: call succeeds, only late.
SLOW_S = 4.0
#: Delayed produces sent at once while it is slow: 6 rounds of the adapter's 10 threads.
CROWD = 60


def test_every_produce_is_answered_within_its_timeout_while_the_broker_is_slow(
        relayed: tuple[object, SlowProxy], redis_url: str, tmp_path: Path) -> None:
    """A broker slow but alive (every answer 4 s late; a SIGSTOPped broker answers nothing, and
    each call then fails at its own timeout): each call of a produce succeeds within its own
    timeout, and the requests queue for the clients' threads. Before the bound, a request was
    answered after the sum of its calls and its wait in that queue (the report: 143-216 s with
    ``produce_timeout_ms`` at 30 s; here some of 60 requests were not answered within 60 s
    at 2 s); now each is answered within ``produce_timeout_ms`` + 5 s."""
    from gateway.cli.kafka_dist import SplitKafka

    k, proxy = relayed
    assert isinstance(k, SplitKafka)
    topic = unique("slow")
    devstack.create_topic(k.bootstrap, topic, 2)
    node = start_node(redis_url, f"127.0.0.1:{proxy.port}", tmp_path, produce_timeout_ms=2000,
                      delay_levels="1s,10s", delay_topic_prefix=f"{unique('wheel')}.")
    try:
        with httpx.Client(timeout=60, verify=TLS, limits=httpx.Limits(max_connections=CROWD + 1)) as http:
            wait_for(lambda: http.post(f"{node.url}/produce", json={
                "topic": topic, "value": "x", "delayMs": 5000}).status_code == 200,
                "a delayed produce to work", timeout=60)
            proxy.delay_s = SLOW_S

            def send(i: int) -> tuple[int, float, str]:
                # unknown topics but one: each needs the broker's metadata, none is cached
                t0 = time.monotonic()
                try:
                    r = http.post(f"{node.url}/produce", json={
                        "topic": topic if i == CROWD - 1 else unique("none"), "value": "x",
                        "delayMs": 5000})
                except httpx.TimeoutException:  # before the bound: some waited over 60 s
                    return 0, time.monotonic() - t0, "no answer"
                return r.status_code, time.monotonic() - t0, r.text[:200]

            with ThreadPoolExecutor(CROWD) as pool:
                answers = list(pool.map(send, range(CROWD)))
    finally:
        proxy.delay_s = 0
        node.stop()
    slowest = max(took for _, took, _ in answers)
    # the requests still waiting were answered 503 (none at all: the fault did not bite)
    assert any(code == 503 for code, _, _ in answers), answers
    # 2 s + 5 s of slack, and 8 s more for a loaded machine (before: some not within 60 s)
    assert slowest < 15, sorted(answers, key=lambda a: a[1])[-5:]
    # a 503, the unknown topics' 404 or the broker's own timeout per record; never a 500
    assert all(code in (503, 404) or (code == 200 and '"failed":1' in text)
               for code, _, text in answers), answers
    print(f"slowest answer {slowest:.1f} s; {sorted({c for c, _, _ in answers})}")


def test_an_admin_write_while_the_broker_hangs_is_applied_and_says_its_copy_is_pending(
        split: object, redis_url: str, tmp_path: Path) -> None:
    """Before: ``PUT /admin/producers/x`` answered 503 while the broker was away, and had been
    applied (Redis has the registry; only its durable copy in the broker had failed). Now the
    answer is the write's (200) with ``Mqgw-Durable-Copy: pending``, and the copy is sent once
    the broker is back."""
    import redis as redis_client
    from confluent_kafka import Consumer, TopicPartition

    from gateway.cli.kafka_dist import SplitKafka

    from ..support import registry_topic

    assert isinstance(split, SplitKafka)
    topic = unique("reg")
    devstack.create_topic(split.bootstrap, topic, 1)
    prefix = unique("regp")  # a registry of this test's own on the shared Redis
    node = start_node(redis_url, split.bootstrap, tmp_path, key_prefix=prefix)
    producer = unique("prod")
    pending_key = f"{prefix}:{{reg}}:copy_pending"
    rds = redis_client.Redis.from_url(redis_url)
    try:
        with httpx.Client(timeout=60, verify=TLS) as http:
            r = http.put(f"{node.url}/admin/producers/{unique('warm')}", json={"topics": [topic]})
            assert r.status_code in (200, 201) and "mqgw-durable-copy" not in r.headers, r.text
            os.killpg(split.broker.proc.pid, signal.SIGSTOP)
            try:
                r = http.put(f"{node.url}/admin/producers/{producer}", json={"topics": [topic]})
                assert r.status_code in (200, 201), r.text
                assert r.headers.get("mqgw-durable-copy") == "pending", r.headers
                assert http.get(f"{node.url}/admin/producers/{producer}").status_code == 200
                assert rds.sismember(pending_key, f"producer/{producer}")
            finally:
                os.killpg(split.broker.proc.pid, signal.SIGCONT)
            wait_for(lambda: not rds.sismember(pending_key, f"producer/{producer}"),
                     "the pending copy to be sent", timeout=60)
    finally:
        node.stop()
        rds.close()
    # the copy is on the broker: the compacted registry topic has the producer's record
    c = Consumer({"bootstrap.servers": split.bootstrap, "group.id": unique("check"),
                  "enable.auto.commit": False, "log_level": 0})
    try:
        c.assign([TopicPartition(registry_topic(redis_url, prefix), 0, 0)])
        keys: set[bytes] = set()
        deadline = time.monotonic() + 30
        while f"producer/{producer}".encode() not in keys and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None and m.key():
                keys.add(m.key())
        assert f"producer/{producer}".encode() in keys, sorted(keys)[:20]
    finally:
        c.close()
