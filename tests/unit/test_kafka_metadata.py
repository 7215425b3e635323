"""Watermarks from the Kafka adapter's metadata consumer (gateway/broker/kafka/metadata.py):
what each partition's answer becomes, over a stand-in for the consumer (the real broker's
answers are tested in tests/system). And the rule that keeps nodes alive: no module calls the
admin client's ``list_offsets`` (see ``Metadata._list_offsets``: librdkafka 2.16's asynchronous
leader query crashed nodes)."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from gateway.broker import BrokerUnavailable, UnknownTopic
from gateway.broker.kafka.metadata import LOG_END, LOG_START, Metadata

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


class _Meta:
    """The metadata consumer: per (partition, timestamp) an offset or an error code."""

    def __init__(self, answers: dict[tuple[int, int], int | KafkaError],
                 partitions: list[int]) -> None:
        self.answers = answers
        self.partitions = partitions
        self.asked: list[int] = []
        self.fail: KafkaException | None = None
        self.brokers: dict[int, Any] = {1: "127.0.0.1:9092"}

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float) -> list[Any]:
        """TopicPartitions as confluent-kafka returns them (its ``error`` is read-only: a
        stand-in with the two fields the adapter reads)."""
        self.asked.append(tps[0].offset)
        if self.fail is not None:
            raise self.fail
        out = []
        for tp in tps:
            a = self.answers[(tp.partition, tp.offset)]
            out.append(SimpleNamespace(offset=a, error=None) if isinstance(a, int) else
                       SimpleNamespace(offset=tp.offset, error=a))
        return out

    def list_topics(self, topic: str, timeout: float) -> Any:
        tm = SimpleNamespace(error=None, partitions=dict.fromkeys(self.partitions))
        return SimpleNamespace(topics={topic: tm}, brokers=self.brokers)


class _Clients:
    def __init__(self, meta: _Meta) -> None:
        self.meta = meta
        self.executor = ThreadPoolExecutor(2)

    async def run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


def _metadata(answers: dict[tuple[int, int], int | KafkaError], parts: list[int]) -> tuple[Metadata, _Meta]:
    meta = _Meta(answers, parts)
    return Metadata(_Clients(meta)), meta  # type: ignore[arg-type]


def test_watermarks_are_the_log_start_and_end_of_each_partition() -> None:
    md, meta = _metadata({(0, LOG_START): 3, (0, LOG_END): 10, (1, LOG_START): 0, (1, LOG_END): 0},
                         [0, 1])
    assert asyncio.run(md.watermarks("t")) == {"0": (3, 10), "1": (0, 0)}
    assert sorted(meta.asked) == [LOG_START, LOG_END]  # one request per timestamp


def test_a_partition_the_consumer_does_not_know_yet_is_left_out() -> None:
    unknown = KafkaError(KafkaError._UNKNOWN_PARTITION)
    md, _ = _metadata({(0, LOG_START): 0, (0, LOG_END): 5, (1, LOG_START): unknown,
                       (1, LOG_END): unknown}, [0, 1])
    assert asyncio.run(md.watermarks("t")) == {"0": (0, 5)}


def test_a_topic_none_of_whose_partitions_answer_is_unknown() -> None:
    md, meta = _metadata({}, [0])
    meta.fail = KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
    with pytest.raises(UnknownTopic):
        asyncio.run(md.watermarks("t"))


def test_partitions_that_answer_nothing_without_an_error_are_unavailable_not_unknown() -> None:
    """A slow or moving leader answers -1 with no error; it was taken for an unknown partition,
    and /message answered 404 unknown_topic for existing topics while a broker was slow."""
    md, _ = _metadata({(0, LOG_START): -1, (0, LOG_END): -1}, [0])
    with pytest.raises(BrokerUnavailable):
        asyncio.run(md.watermarks("t"))


def test_metadata_that_lists_no_broker_is_no_verdict_on_the_topic() -> None:
    """What a broker just unfenced by its KRaft controller answers for a moment."""
    md, meta = _metadata({(0, LOG_START): 0, (0, LOG_END): 1}, [0])
    meta.brokers = {}
    with pytest.raises(BrokerUnavailable):
        asyncio.run(md.partitions("t"))


def test_a_broker_failure_is_unavailable_and_a_moving_leader_is_asked_again() -> None:
    md, meta = _metadata({(0, LOG_START): 0, (0, LOG_END): 1}, [0])
    meta.fail = KafkaException(KafkaError(KafkaError._TRANSPORT))
    with pytest.raises(BrokerUnavailable):
        asyncio.run(md.watermarks("t"))
    moving = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    md, meta = _metadata({(0, LOG_START): 0, (0, LOG_END): moving}, [0])

    async def leader_arrives() -> dict[str, tuple[int, int]]:
        task = asyncio.ensure_future(md.watermarks("t"))
        await asyncio.sleep(0.01)
        meta.answers[(0, LOG_END)] = 7
        return await task
    assert asyncio.run(leader_arrives()) == {"0": (0, 7)}


def test_all_watermarks_leaves_out_what_never_answers() -> None:
    gone = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    md, _ = _metadata({(0, LOG_START): 1, (0, LOG_END): 2, (1, LOG_START): gone, (1, LOG_END): gone},
                      [0, 1])
    got = asyncio.run(md.all_watermarks([TopicPartition("t", 0), TopicPartition("t", 1)]))
    assert got == {("t", 0): (1, 2)}


def test_no_module_calls_the_admin_clients_list_offsets() -> None:
    calls = [f"{p.relative_to(GATEWAY.parent)}:{n}" for p in GATEWAY.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\.list_offsets\(", line) and p.name != "devstack.py"]
    # devstack.py (the dev stack's topic creation) calls it only once every leader is known
    # (its list_topics answered them), when librdkafka never waits for a metadata update.
    assert calls == []
