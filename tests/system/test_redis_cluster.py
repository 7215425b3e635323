"""The gateway runs unchanged on Redis Cluster: every script touches one hash-tagged slot."""

from __future__ import annotations

import pytest

from ..support import Api, start_node, unique

pytestmark = pytest.mark.slow  # starts a 3-master Redis Cluster


@pytest.mark.timeout(120)
def test_produce_fetch_ack_on_redis_cluster(redis_cluster, bootstrap: str, make_topic, tmp_path) -> None:
    nodes = [start_node(redis_cluster.url, bootstrap, tmp_path) for _ in range(2)]
    try:
        api = Api([n.url for n in nodes])
        topic = make_topic(3)
        groups = [unique() for _ in range(8)]  # spread over all three masters' slots
        for g in groups:
            api.config(g, start="earliest")
        api.produce(topic, [f"v{i}" for i in range(30)])
        for g in groups:
            seen = []
            for client in ("", "c1"):
                got: list[str] = []
                rid = ""
                for _ in range(20):
                    params = {"consumer": g, "topic": topic, "max": 7}
                    if client:
                        params["clientId"] = client
                    if rid:
                        params["requestId"] = rid
                    body = api.message(**params).json()
                    rid = ""
                    if body["status"] == "empty":
                        break
                    got += [m["value"] for m in body["messages"]]
                    rid = body["requestId"]
                seen.append(sorted(got))
            assert seen[0] == seen[1] == sorted(f"v{i}" for i in range(30)), g
            view = api.http.get(api.url(f"/consumers/{g}/queues")).json()["queues"]
            assert sum(q["committedOffset"] for q in view) == 30
        # The registry and key checks work there too: a registered consumer with a key, auth off
        # here, so only the registry paths and unregister with offset deletion (SCAN per master).
        g = groups[0]
        r = api.http.put(api.url(f"/admin/consumers/{g}"), json={"topics": [topic], "mode": "cluster"})
        assert r.status_code == 201, r.text
        assert api.message(consumer=g, topic=topic, clientId="c1").status_code == 400
        listed = {c["consumer"] for c in api.http.get(api.url("/admin/consumers")).json()["consumers"]}
        assert set(groups) <= listed
        out = api.http.delete(api.url(f"/admin/consumers/{g}"), params={"deleteOffsets": "true"}).json()
        # q, q:c1, clients, and each queue hash's index state (q:ix:<topic>, q:c1:ix:<topic>; the
        # ready and lock indexes are empty once everything is acked, so Redis holds none)
        assert out["unregistered"] is True and out["keysDeleted"] == 5
        gone = api.http.get(api.url(f"/consumers/{g}/queues"))  # nothing left of it: unknown
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "unknown_consumer", gone.text
    finally:
        for n in nodes:
            n.stop()
