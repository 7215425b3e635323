"""Consumer groups on the brokers: offset checkpoints (UPDATE/QUERY_CONSUMER_OFFSET) and the
reader group every pull names.

A group must exist before the broker stores an offset for it (UPDATE answers 26 otherwise and
never creates one, ``ConsumerManageProcessor``): it is created on first use with
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (which needs admin rights where ACLs are on). Offsets are
kept per broker, so each queue's offset goes to its own broker's master. Groups are named
after the consumer (:func:`~.message.group_name`), so ``mqadmin consumerProgress`` and the
RocketMQ dashboard show gateway consumers under their names.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from ...aio import stop_task
from ..base import BrokerUnavailable
from .client import Client, check
from .codes import DEFAULT_TOPIC, Req, Resp
from .message import group_name, to_broker_name

#: ``MixAll.RETRY_GROUP_TOPIC_PREFIX``
RETRY_PREFIX = "%RETRY%"
log = logging.getLogger("mqgw.rocketmq")


class Groups:
    def __init__(self, client: Client) -> None:
        self._client = client
        self._made: set[tuple[str, str]] = set()  # (address, group) known to exist
        self._retry_topics: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._maker: asyncio.Task[None] | None = None

    async def _make_retry_topics(self) -> None:
        while not self._retry_topics.empty():
            addr, group = self._retry_topics.get_nowait()
            try:
                check(await self._client.call(addr, Req.UPDATE_AND_CREATE_TOPIC, {
                    "topic": RETRY_PREFIX + group, "defaultTopic": DEFAULT_TOPIC,
                    "readQueueNums": "1", "writeQueueNums": "1", "perm": "6",
                    "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}),
                      f"create the retry topic of {group}")
            except BrokerUnavailable as e:  # only tools miss it; made again with the group
                log.warning("%s", e)
                self._made.discard((addr, group))

    async def close(self) -> None:
        await stop_task(self._maker)

    async def ensure(self, addr: str, group: str, fresh: bool = False) -> None:
        """Create ``group`` (RocketMQ's spelling) on the broker at ``addr`` unless known there."""
        if (addr, group) in self._made and not fresh:
            return
        body = orjson.dumps({"groupName": group, "consumeEnable": True,
                             "consumeBroadcastEnable": True, "retryMaxTimes": 16})
        resp = await self._client.call(addr, Req.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)
        check(resp, f"create consumer group {group}")
        # The group's retry topic, as a Java consumer's registration makes it: `mqadmin
        # consumerProgress -g <group>` finds a group's topics through it (without it: code 17).
        # Made in the background, one at a time: on the request path, a herd of 100 new
        # consumers made 100 topics at once (each re-registers every topic of the broker with
        # the name servers) and starved the node (test_checkpoint's herd test, one CI run).
        self._retry_topics.put_nowait((addr, group))
        if self._maker is None or self._maker.done():
            self._maker = asyncio.create_task(self._make_retry_topics())
        self._made.add((addr, group))

    async def save(self, group: str, topic: str, offsets: dict[str, int]) -> None:
        g = group_name(group)
        await asyncio.gather(*(self._save_one(g, topic, q, o) for q, o in offsets.items()))

    async def _save_one(self, g: str, topic: str, queue: str, offset: int) -> None:
        addr, qid = await self._client.master_of(topic, queue)
        ext = {"consumerGroup": g, "topic": to_broker_name(topic), "queueId": str(qid),
               "commitOffset": str(offset)}
        await self.ensure(addr, g)
        resp = await self._client.call(addr, Req.UPDATE_CONSUMER_OFFSET, ext)
        if resp.code == Resp.SUBSCRIPTION_GROUP_NOT_EXIST:  # deleted behind our back
            await self.ensure(addr, g, fresh=True)
            resp = await self._client.call(addr, Req.UPDATE_CONSUMER_OFFSET, ext)
        check(resp, f"save offset of {g}")

    async def load(self, group: str, topic: str, queues: list[str]) -> dict[str, int]:
        g = group_name(group)
        got = await asyncio.gather(*(self._load_one(g, topic, q) for q in queues))
        return {q: o for q, o in zip(queues, got, strict=True) if o is not None}

    async def _load_one(self, g: str, topic: str, queue: str) -> int | None:
        addr, qid = await self._client.master_of(topic, queue)
        resp = await self._client.call(addr, Req.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": g, "topic": to_broker_name(topic), "queueId": str(qid),
            "setZeroIfNotFound": "false"})
        if resp.code in (Resp.QUERY_NOT_FOUND, Resp.SUBSCRIPTION_GROUP_NOT_EXIST):
            return None
        check(resp, f"load offset of {g}")
        return int(resp.ext["offset"])

    async def forget(self, group: str) -> None:
        g = group_name(group)
        masters = await self._client.masters()
        for addr in masters.values():
            resp = await self._client.call(addr, Req.DELETE_SUBSCRIPTIONGROUP,
                                           {"groupName": g, "cleanOffset": "true"})
            if resp.code not in (Resp.SUCCESS, Resp.SUBSCRIPTION_GROUP_NOT_EXIST):
                raise BrokerUnavailable(f"delete consumer group {g}: RocketMQ answered "
                                        f"{resp.code} {resp.remark or ''}")
            self._made.discard((addr, g))
            # and its retry topic (made with the group), on the broker and the name servers
            await self._client.call(addr, Req.DELETE_TOPIC_IN_BROKER, {"topic": RETRY_PREFIX + g})
        if masters:
            await self._client.namesrv_call(Req.DELETE_TOPIC_IN_NAMESRV, {"topic": RETRY_PREFIX + g})

