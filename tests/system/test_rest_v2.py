"""The Confluent REST Proxy v2 API on real nodes, real Redis and Kafka, through a round-robin
load balancer (tests/support/balancer.py: each request to the next node, no stickiness):

- two published v2 client libraries run their own produce/consume flows
  (tests/support/rest_v2_flows; why these two: docs/design/rest-v2-clients.md);
- offsets committed with plain HTTP (no published client commits v2 offsets);
- a node killed in the middle of a consumer instance's run: nothing lost, the instance lives on;
- the Strimzi HTTP bridge behind the same balancer (where the bench's peer is here), which keeps
  each instance in one bridge's memory.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.cli import devstack

from ..support import Node, create_topic, unique

ROOT = Path(__file__).resolve().parents[2]
FLOWS = ROOT / "tests" / "support" / "rest_v2_flows"
V2 = "application/vnd.kafka.v2+json"
JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"


class Balancer:
    def __init__(self, upstreams: list[str]) -> None:
        port = devstack.free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.balancer", str(port),
                                      *upstreams], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def served(self) -> list[str]:
        return httpx.get(self.url + "/_balancer").text.split()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def two(node_factory: Callable[..., Node]) -> Iterator[tuple[list[Node], Balancer]]:
    nodes = [node_factory(instance_wait_ms=200) for _ in range(2)]
    lb = Balancer([n.url for n in nodes])
    try:
        yield nodes, lb
    finally:
        lb.stop()


def run_flow(name: str, base: str, topic: str, group: str) -> None:
    out = subprocess.run([sys.executable, str(FLOWS / name), base, topic, group], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_nlp_kafka_rest_api_runs_its_flow_over_two_nodes(
        two: tuple[list[Node], Balancer], bootstrap: str) -> None:
    """nlp-kafka-rest-api: json produce, a binary instance (its path rebuilt from the name it
    chose), records until every key came, delete; each request to the other node."""
    nodes, lb = two
    topic = unique("nlp")
    create_topic(bootstrap, f"{topic}-response", 2)
    run_flow("flow_nlp.py", lb.url, topic, unique("g"))
    assert {n.url for n in nodes} <= set(lb.served())


def test_pymapr_kafkarest_runs_its_flow_over_two_nodes(
        two: tuple[list[Node], Balancer], bootstrap: str) -> None:
    """pymapr-kafkarest: json produce, a json instance used through the base_uri it was
    answered (the balancer's), records, a seek to the beginning and the records again, delete."""
    nodes, lb = two
    topic = unique("mapr")
    create_topic(bootstrap, topic, 1)
    run_flow("flow_mapr.py", lb.url, topic, unique("g"))
    assert {n.url for n in nodes} <= set(lb.served())


def _post(http: httpx.Client, url: str, body: Any = None, ctype: str = V2) -> httpx.Response:
    return http.post(url, content=orjson.dumps(body) if body is not None else b"",
                     headers={"content-type": ctype})


def _records(http: httpx.Client, base: str, accept: str = JSON_V2) -> list[dict[str, Any]]:
    r = http.get(base + "/records", params={"timeout": 500}, headers={"accept": accept})
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()
    return out


def test_offsets_committed_with_plain_http_hold_for_the_next_instance(
        two: tuple[list[Node], Balancer], bootstrap: str) -> None:
    """auto.commit.enable=false: what is committed (POST offsets, the last record's offset)
    is where the group stands; what is not comes again after the lock timeout."""
    _, lb = two
    topic, group = unique("commit"), unique("g")
    create_topic(bootstrap, topic, 1)
    with httpx.Client(timeout=30) as http:
        r = _post(http, f"{lb.url}/topics/{topic}", {"records": [{"value": i} for i in range(5)]},
                  JSON_V2)
        assert r.status_code == 200 and [o["offset"] for o in r.json()["offsets"]] == list(range(5))
        r = _post(http, f"{lb.url}/consumers/{group}", {"name": "a", "format": "json",
                                                        "auto.offset.reset": "earliest",
                                                        "auto.commit.enable": "false"})
        base = r.json()["base_uri"]
        assert base == f"{lb.url}/consumers/{group}/instances/a", r.text
        assert _post(http, base + "/subscription", {"topics": [topic]}).status_code == 204
        got = _records(http, base)
        assert [g["value"] for g in got] == list(range(5))
        r = _post(http, base + "/offsets", {"offsets": [{"topic": topic, "partition": 0,
                                                         "offset": 4}]})
        assert (r.status_code, r.content) == (200, b"")  # as Confluent's: no body
        r = http.request("GET", base + "/offsets", content=orjson.dumps(
            {"partitions": [{"topic": topic, "partition": 0}]}), headers={"content-type": V2})
        assert r.json()["offsets"][0]["offset"] == 5
        assert http.delete(base).status_code == 204
        r = _post(http, f"{lb.url}/consumers/{group}", {"name": "b", "format": "json"})
        b = r.json()["base_uri"]
        _post(http, b + "/subscription", {"topics": [topic]})
        assert _records(http, b) == []  # the group stands after offset 4
        assert http.delete(b).status_code == 204


def test_a_node_killed_mid_run_loses_nothing_and_the_instance_lives_on(
        two: tuple[list[Node], Balancer], bootstrap: str) -> None:
    """One instance reads 60 records, half before and half after one of the two nodes is
    killed; the balancer sends everything to the survivor from then on. Every record comes
    (at least once), and the instance answers on the surviving node: nothing of it lived in
    the dead one."""
    nodes, lb = two
    topic, group = unique("kill"), unique("g")
    create_topic(bootstrap, topic, 3)
    seen: set[int] = set()
    with httpx.Client(timeout=30) as http:
        r = _post(http, f"{lb.url}/topics/{topic}", {"records": [{"value": i} for i in range(60)]},
                  JSON_V2)
        assert all(o["error_code"] is None for o in r.json()["offsets"])
        r = _post(http, f"{lb.url}/consumers/{group}", {"name": "i", "format": "json",
                                                        "auto.offset.reset": "earliest",
                                                        "max.poll.records": 10})
        base = r.json()["base_uri"]
        assert _post(http, base + "/subscription", {"topics": [topic]}).status_code == 204
        for _ in range(3):
            seen |= {g["value"] for g in _records(http, base)}
        nodes[0].kill()
        for _ in range(40):
            if len(seen) == 60:
                break
            seen |= {g["value"] for g in _records(http, base)}
        assert seen == set(range(60))
        assert http.delete(base).status_code == 204


def test_the_strimzi_bridge_behind_the_same_balancer_loses_its_instance(
        bootstrap: str, tmp_path: Path) -> None:
    """The same round-robin in front of two Strimzi HTTP bridges 1.1.0 (the bench's peer): an
    instance lives in the bridge that made it, so requests the balancer sends to the other one
    find no such consumer (404), and once its bridge is killed the instance is gone. The
    gateway's side of the same run is the test above."""
    sys.path.insert(0, str(ROOT))
    from bench import bridge  # the bench's peer: its jar, a JDK 21+, its Maven dependencies

    why = bridge.available()
    if why is not None:
        pytest.skip(why)
    bridges = [bridge.start(bootstrap, 10, tmp_path / f"bridge{i}.log") for i in range(2)]
    lb = Balancer([f"http://127.0.0.1:{b.port}" for b in bridges])
    try:
        topic, group = unique("strimzi"), unique("g")
        create_topic(bootstrap, topic, 1)
        with httpx.Client(timeout=30) as http:
            # (the bridge takes objects, arrays, strings or null as json values: not numbers)
            r = _post(http, f"{lb.url}/topics/{topic}", {"records": [{"value": {"n": 1}}]},
                      JSON_V2)
            assert r.status_code == 200, r.text
            r = _post(http, f"{lb.url}/consumers/{group}", {"name": "i", "format": "json",
                                                            "auto.offset.reset": "earliest"})
            assert r.status_code == 200, r.text
            maker = lb.served()[-1]
            path = f"{lb.url}/consumers/{group}/instances/i"
            answers = [_post(http, path + "/subscription", {"topics": [topic]}).status_code
                       for _ in range(4)]
            assert sorted(set(answers)) == [204, 404], answers  # every other one: the other bridge
            bridges[[f"http://127.0.0.1:{b.port}" for b in bridges].index(maker)].stop(signal.SIGKILL)
            for _ in range(2):  # whichever the balancer tries first, the survivor answers
                r = http.get(path + "/records", headers={"accept": JSON_V2})
                assert r.status_code == 404, r.text  # the instance died with its bridge
    finally:
        lb.stop()
        for b in bridges:
            b.stop()
