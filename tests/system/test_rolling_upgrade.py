"""A rolling upgrade from the key layout before issue 35 (no queue indexes, every watermark in
every choose) to today's, under the acceptance pattern: nothing lost, every duplicate flagged.

The old version is this repository at :data:`OLD`, exported with ``git archive`` and run as a
node beside today's on one Redis. Old nodes change the queue hash without the indexes; new nodes
check the indexes against the hash and rebuild them every ``index_rebuild_ms``
(docs/design/constant-time-choose.md), so the mixed window may only cost time.
"""

from __future__ import annotations

import asyncio
import subprocess
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest

from ..support import ROOT, Api, Node, Tally, consume, start_node, unique

pytestmark = [pytest.mark.every_broker, pytest.mark.slow]

#: The last commit whose choose.lua scans every queue (before the indexes).
OLD = "f0e8a2c"


@pytest.fixture(scope="module")
def old_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The old version's ``gateway`` package, in a folder of its own."""
    have = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{OLD}^{{commit}}"],
                          capture_output=True, check=False)
    if have.returncode != 0:  # a shallow clone; CI clones whole (`git clone`)
        pytest.skip(f"needs the repository's history ({OLD})")
    tree = subprocess.run(["git", "-C", str(ROOT), "archive", OLD, "gateway"],
                          capture_output=True, check=True).stdout
    where = tmp_path_factory.mktemp("old-gateway")
    with tarfile.open(fileobj=BytesIO(tree)) as tar:
        tar.extractall(where, filter="data")
    assert not (where / "gateway" / "store" / "marks.py").exists()  # really the old layout
    return where


@pytest.mark.timeout(300)
def test_old_and_new_nodes_share_a_group_through_an_upgrade(
        redis_url: str, bootstrap: str, tmp_path: Path, old_source: Path, make_topic: Any) -> None:
    """Two old nodes serve a registered group; one is replaced by a new node (both versions
    serve the group at once, each choose, ack, drop and unlock landing on either), then the
    other; clients drop and hand back batches throughout. Every record arrives, every repeat is
    flagged."""
    settings: dict[str, Any] = {"metadata_refresh_ms": 100}
    started: list[Node] = []
    try:
        old = [start_node(redis_url, bootstrap, tmp_path, source=old_source, **settings)
               for _ in range(2)]
        started += old
        api = Api([n.url for n in old])
        topic, group = make_topic(8), unique()
        r = api.http.put(api.url(f"/admin/consumers/{group}"), json={
            "topics": [topic], "mode": "cluster", "start": "earliest", "consumeTimeoutMs": 1500})
        assert r.status_code == 201, r.text
        total = 3_000
        api.produce(topic, [f"m{i}" for i in range(total)])
        urls = list(api.urls)  # the consumers' balancer: changed in place as nodes are replaced
        tally = Tally()

        async def run() -> None:
            task = asyncio.create_task(consume(urls, group, topic, total, tally, consumers=6,
                                               max_messages=20, drop_every=11, unlock_every=7,
                                               deadline_s=200))
            for share, replaced in ((0.25, old[0]), (0.6, old[1])):
                while len(tally.seen) < total * share and not task.done():  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                new = await asyncio.to_thread(start_node, redis_url, bootstrap, tmp_path,
                                              **settings)
                started.append(new)
                urls.append(new.url)
                urls.remove(replaced.url)
                await asyncio.to_thread(replaced.stop)
            await task
        asyncio.run(run())
        assert len(tally.seen) == total, f"lost {total - len(tally.seen)} messages"
        assert tally.duplicate_not_redelivered == [], tally.duplicate_not_redelivered[:10]
        # the new nodes kept the group's indexes (and the old ones ran without them)
        import redis
        with redis.Redis.from_url(redis_url) as r:
            assert r.exists(f"mqgw:{{{group}}}:q:ix:{topic}")
    finally:
        for n in started:
            n.stop()
