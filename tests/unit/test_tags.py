"""Tags (RocketMQ's TAGS; core/fetch.py, core/produce.py, core/nack.py): a fetch with a tag
filter gets only those records and commits past the others, a nack re-reads the batch with the
same filter (a refused record is never retried), and brokers without tags refuse them."""

from __future__ import annotations

import pytest

from gateway.broker import OutgoingMessage
from gateway.broker.memory import MemoryBroker
from gateway.core.errors import Invalid
from gateway.core.fetch import parse_tag_filter, tag_expression
from gateway.core.produce import produce
from gateway.store import OffsetStore

from .conftest import Gateway, build

pytestmark = pytest.mark.anyio

T = "orders"


@pytest.fixture
def tagged(store: OffsetStore) -> Gateway:
    broker = MemoryBroker(tags=True)
    broker.create(T, 1)
    return build(store, broker)


async def test_a_filtered_fetch_gets_its_tags_and_commits_past_the_rest(tagged: Gateway) -> None:
    await produce(tagged.broker, T, [OutgoingMessage(f"v{i}".encode(), tag="A" if i % 3 == 0 else "B")
                                     for i in range(7)])
    got = await tagged.fetch("c", tags=frozenset({"A"}))
    assert got.batch is not None
    assert [(r.offset, r.tag) for r in got.batch.records] == [(0, "A"), (3, "A"), (6, "A")]
    assert got.batch.next_offset == 7
    assert tagged.codec.decode(got.batch.request_id).tags == "A"  # the nack re-reads with it
    ack = await tagged.consume.ack(got.batch.request_id)
    assert ack.committed == 7
    again = await tagged.fetch("c", tags=frozenset({"A"}))
    assert again.batch is None


async def test_a_stretch_of_other_tags_only_is_committed_past(tagged: Gateway) -> None:
    await produce(tagged.broker, T, [OutgoingMessage(b"x", tag="B") for _ in range(5)])
    assert (await tagged.fetch("c", tags=frozenset({"A"}))).batch is None
    await produce(tagged.broker, T, [OutgoingMessage(b"a", tag="A")])
    # a long poll: the node's cached watermarks learn of the new record within its wait
    got = await tagged.fetch("c", tags=frozenset({"A"}), wait_ms=5_000)
    assert got.batch is not None and [r.offset for r in got.batch.records] == [5]
    assert got.batch.offset == 5  # the refused stretch was committed past without a batch


async def test_brokers_without_tags_refuse_them(gw: Gateway) -> None:
    gw.broker.create(T, 1)
    with pytest.raises(Invalid) as e:
        await gw.fetch("c", tags=frozenset({"A"}))
    assert e.value.code == "tag_filter_unsupported"
    with pytest.raises(Invalid) as e:
        await produce(gw.broker, T, [OutgoingMessage(b"v", tag="A")])
    assert e.value.code == "tag_unsupported"


def test_tag_expressions() -> None:
    assert parse_tag_filter("A || B") == frozenset({"A", "B"}) == parse_tag_filter("B||A")
    assert parse_tag_filter("*") is None and parse_tag_filter("") is None
    assert tag_expression(frozenset({"B", "A"})) == "A||B" and tag_expression(None) == ""
    for bad in ("A|B", "A||", "\x01"):
        with pytest.raises(Invalid):
            parse_tag_filter(bad)
