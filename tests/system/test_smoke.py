"""The product end to end in a few seconds, for `make test-fast`: two gateway nodes (uvicorn
processes) over a real redis-server and the real broker; records produced on one node are
fetched and acknowledged on the other, and a repeated ack changes nothing. The rules behind each
step are proven in process in tests/unit; this proves the processes are wired together."""

from __future__ import annotations

import pytest

from ..support import Api, unique

pytestmark = [pytest.mark.every_broker, pytest.mark.timeout(120)]


def test_produce_on_one_node_fetch_and_ack_on_another(node_factory, make_topic) -> None:
    nodes = [node_factory(), node_factory()]
    api = Api([n.url for n in nodes])
    try:
        topic, consumer = make_topic(1), unique()
        api.config(consumer, start="earliest")
        api.produce(topic, [f"v{i}" for i in range(5)], partition=0)
        got: list[str] = []
        acked: list[str] = []
        while len(got) < 5:
            body = api.message(1, consumer=consumer, topic=topic, max=10, wait_ms=5000).json()
            assert body["status"] in ("ok", "empty"), body
            if body["status"] == "ok":
                got += [m["value"] for m in body["messages"]]
                r = api.ack(body["requestId"], node=0)
                assert r.status_code == 200 and r.json()["result"] == "committed", r.text
                acked.append(body["requestId"])
        assert got == [f"v{i}" for i in range(5)]
        again = api.ack(acked[0], node=1)  # a repeated ack: answered, nothing moves back
        assert again.json()["result"] == "already_committed", again.text
        body = api.message(0, consumer=consumer, topic=topic, wait_ms=0).json()
        assert body["status"] == "empty", body
    finally:
        api.http.close()
