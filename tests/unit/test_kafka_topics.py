"""Topic creation in the Kafka adapter (gateway/broker/kafka/topics.py) when the broker's answer
is lost: a creation that timed out but was applied is a creation (before: 503, and the client's
retry got 409 topic_exists), one the broker does not know is a 503; a topic created whose
partitions do not serve in time is created. Over stand-ins for the admin client and the
metadata (the real broker's answers are tested in tests/system)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from gateway.broker import BrokerUnavailable, UnknownTopic
from gateway.broker.kafka import topics


class _Future:
    def __init__(self, error: KafkaError | None) -> None:
        self.error = error

    def result(self, timeout: float) -> None:
        if self.error is not None:
            raise KafkaException(self.error)


class _Admin:
    def __init__(self, error: KafkaError | None) -> None:
        self.error = error

    def create_topics(self, new: list[Any], request_timeout: float) -> dict[str, _Future]:
        return {t.topic: _Future(self.error) for t in new}


class _Clients:
    def __init__(self, admin: _Admin) -> None:
        self.admin = admin
        self.executor = ThreadPoolExecutor(1)

    async def run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)


class _Metadata:
    def __init__(self, exists: bool, served: bool = True) -> None:
        self.exists = exists
        self.served = served

    def forget(self, name: str) -> None:
        pass

    async def partitions(self, name: str, fresh: bool = False) -> list[int]:
        if not self.exists:
            raise UnknownTopic(name)
        return [0, 1]

    async def all_watermarks(self, tps: list[Any]) -> dict[Any, tuple[int, int]]:
        return {(tp.topic, tp.partition): (0, 0) for tp in tps} if self.served else {}


def _maker(error: KafkaError | None, md: _Metadata) -> topics.TopicMaker:
    return topics.TopicMaker(_Clients(_Admin(error)), md, -1)  # type: ignore[arg-type]


def test_a_creation_that_timed_out_but_was_applied_is_a_creation() -> None:
    maker = _maker(KafkaError(KafkaError._TIMED_OUT), _Metadata(exists=True))
    asyncio.run(maker.create("t", 2, None, timeout_s=1))


def test_a_creation_the_broker_does_not_know_is_unavailable() -> None:
    maker = _maker(KafkaError(KafkaError._TIMED_OUT), _Metadata(exists=False))
    with pytest.raises(BrokerUnavailable, match="does not list topic t now"):
        asyncio.run(maker.create("t", 2, None, timeout_s=1))


def test_a_topic_created_whose_partitions_do_not_serve_in_time_is_created(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "_SERVED_POLL_S", 0.01)
    maker = _maker(None, _Metadata(exists=True, served=False))
    asyncio.run(maker.create("t", 2, None, timeout_s=0.05))
