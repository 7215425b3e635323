"""Connections to name servers and brokers, and topic routes: what every other module calls.

One multiplexed connection per address (remoting.Connection), kept for the process's life.
Routes (which broker serves which queues of a topic) come from a name server and are cached for
:data:`ROUTE_TTL_S`, as Kafka's partition lists are; a failed call on a broker drops the cache so
that the next one asks again (a broker moved or restarted). Name servers are tried in turn: the
first that answers serves until it fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..base import BrokerUnavailable, UnknownTopic
from .codes import PERM_READ, PERM_WRITE, Req, Resp
from .message import from_broker_name, to_broker_name
from .remoting import Command, Connection, RemotingError, loads_lenient, request

#: How long a topic's route is trusted before it is asked for again.
ROUTE_TTL_S = 5.0
MASTER_ID = "0"


@dataclass(frozen=True, slots=True)
class Slot:
    """One queue of a topic: the port's queue id is ``f"{broker}.{queue_id}"``."""

    broker: str
    queue_id: int
    readable: bool
    writable: bool

    @property
    def qid(self) -> str:
        return f"{self.broker}.{self.queue_id}"


@dataclass(frozen=True, slots=True)
class Route:
    slots: tuple[Slot, ...]
    #: broker name -> master address, for the brokers of this topic that have a master now
    masters: dict[str, str]
    #: broker name -> every id -> address (replicas included)
    addrs: dict[str, dict[str, str]]

    def readable(self) -> list[Slot]:
        return [s for s in self.slots if s.readable and s.broker in self.masters]

    def writable(self) -> list[Slot]:
        return [s for s in self.slots if s.writable and s.broker in self.masters]


def parse_queue(queue: str) -> tuple[str, int]:
    """``"broker-a.3"`` -> ``("broker-a", 3)``; a malformed id names no queue."""
    broker, _, qid = queue.rpartition(".")
    if not broker or not qid.isdigit():
        raise UnknownTopic(f"no queue {queue!r}: queue ids are <broker name>.<queue number>")
    return broker, int(qid)


def check(resp: Command, what: str) -> Command:
    """The answer if it succeeded; else the port's error for it."""
    if resp.code == Resp.SUCCESS:
        return resp
    if resp.code == Resp.TOPIC_NOT_EXIST:
        raise UnknownTopic(resp.remark or what)
    raise BrokerUnavailable(f"{what}: RocketMQ answered {resp.code} {resp.remark or ''}".rstrip())


class Client:
    """Calls to name servers and brokers, with the route cache."""

    def __init__(self, namesrv: str, timeout_ms: int = 3000) -> None:
        self.namesrv = [a.strip() for a in namesrv.replace(",", ";").split(";") if a.strip()]
        if not self.namesrv:
            raise ValueError("rocketmq_namesrv: give at least one name server, host:port")
        self.timeout = timeout_ms / 1000
        self._conns: dict[str, Connection] = {}
        self._ns_index = 0
        self._routes: dict[str, tuple[float, Route]] = {}
        #: The brokers each topic was last seen on (kept when the route cache is dropped).
        self._seen_on: dict[str, frozenset[str]] = {}
        #: Broker and cluster names seen so far (each is a topic of the broker's own).
        self.known_own: frozenset[str] = frozenset()

    def _conn(self, addr: str) -> Connection:
        c = self._conns.get(addr)
        if c is None:
            c = self._conns[addr] = Connection(addr, connect_timeout=self.timeout)
        return c

    async def close(self) -> None:
        conns, self._conns = self._conns, {}
        for c in conns.values():
            await c.close()

    async def call(self, addr: str, code: int, ext: dict[str, str] | None = None,
                   body: bytes = b"", wait_s: float | None = None) -> Command:
        """One request to a broker; :class:`BrokerUnavailable` when it cannot be reached."""
        try:
            return await self._conn(addr).call(request(code, ext, body), wait_s or self.timeout)
        except RemotingError as e:
            self._routes.clear()  # the broker may have moved: ask the name server again
            raise BrokerUnavailable(str(e)) from None

    async def namesrv_call(self, code: int, ext: dict[str, str] | None = None) -> Command:
        """A request to the first name server that answers."""
        last: Exception | None = None
        for i in range(len(self.namesrv)):
            addr = self.namesrv[(self._ns_index + i) % len(self.namesrv)]
            try:
                resp = await self._conn(addr).call(request(code, ext), self.timeout)
                self._ns_index = (self._ns_index + i) % len(self.namesrv)
                return resp
            except RemotingError as e:
                last = e
        raise BrokerUnavailable(f"no RocketMQ name server answers ({', '.join(self.namesrv)}): {last}")

    # -- routes ------------------------------------------------------------------------------
    async def route(self, topic: str, fresh: bool = False) -> Route:
        """The topic's queues and their brokers (cached); raises :class:`UnknownTopic`."""
        cached = self._routes.get(topic)
        if cached and not fresh and time.monotonic() - cached[0] < ROUTE_TTL_S:
            return cached[1]
        resp = await self.namesrv_call(Req.GET_ROUTEINFO_BY_TOPIC,
                                       {"topic": to_broker_name(topic), "acceptStandardJsonOnly": "true"})
        if resp.code == Resp.TOPIC_NOT_EXIST:
            self._routes.pop(topic, None)
            await self._raise_unknown(topic)
        check(resp, f"route of {topic}")
        data = loads_lenient(resp.body)
        addrs = {b["brokerName"]: {str(k): v for k, v in (b.get("brokerAddrs") or {}).items()}
                 for b in data.get("brokerDatas") or []}
        masters = {name: a[MASTER_ID] for name, a in addrs.items() if MASTER_ID in a}
        slots: list[Slot] = []
        for q in sorted(data.get("queueDatas") or [], key=lambda q: q["brokerName"]):
            perm = int(q.get("perm", 6))
            n = max(int(q.get("readQueueNums", 0)), int(q.get("writeQueueNums", 0)))
            reads, writes = int(q.get("readQueueNums", 0)), int(q.get("writeQueueNums", 0))
            slots.extend(Slot(q["brokerName"], i, i < reads and bool(perm & PERM_READ),
                              i < writes and bool(perm & PERM_WRITE)) for i in range(n))
        route = Route(tuple(slots), masters, addrs)
        if not route.readable():
            self._routes.pop(topic, None)
            raise UnknownTopic(topic)
        self._routes[topic] = (time.monotonic(), route)
        self._seen_on[topic] = frozenset(s.broker for s in route.slots)
        if not self._seen_on[topic] <= self.known_own:
            self.known_own = self.known_own | self._seen_on[topic]
        return route

    async def _raise_unknown(self, topic: str) -> None:
        """The name servers know no route: the topic does not exist, or the brokers holding it
        are gone (a name server drops a broker's routes the moment its connection closes:
        measured, a SIGKILLed broker's topics answered 17 at once). The second is a broker
        outage (503), not a missing topic (404)."""
        masters = await self.masters()
        live = set(masters)
        seen = self._seen_on.get(topic, frozenset())
        gone = seen - live
        if not live or gone:
            raise BrokerUnavailable(f"the RocketMQ broker(s) {', '.join(sorted(gone)) or 'of the cluster'} "
                                    f"holding {topic} are not registered with the name servers")
        # A restarted broker is listed before its topics are (it registers them after itself):
        # in that moment a topic it holds has no route, and a CI run answered one 404 during
        # tests/system/test_rocketmq.py's broker restart. Its brokers are asked (GET_TOPIC_CONFIG).
        for broker in sorted(seen):
            resp = await self.call(masters[broker], Req.GET_TOPIC_CONFIG,
                                   {"topic": to_broker_name(topic)})
            if resp.code != Resp.TOPIC_NOT_EXIST:
                raise BrokerUnavailable(f"the RocketMQ broker {broker} holds {topic} but has not "
                                        "registered it with the name servers yet")
        self._seen_on.pop(topic, None)
        raise UnknownTopic(topic)

    def forget(self, topic: str) -> None:
        self._routes.pop(topic, None)

    async def master_of(self, topic: str, queue: str) -> tuple[str, int]:
        """The address serving ``queue`` of ``topic`` and its queue number."""
        broker, qid = parse_queue(queue)
        route = await self.route(topic)
        addr = route.masters.get(broker)
        if addr is None or not any(s.broker == broker and s.queue_id == qid for s in route.slots):
            if broker in route.addrs or any(s.broker == broker for s in route.slots):
                raise BrokerUnavailable(f"broker {broker} of {topic} has no master now")
            raise UnknownTopic(f"{topic} has no queue {queue}")
        return addr, qid

    async def cluster(self) -> dict[str, dict[str, str]]:
        """Every broker name -> {id: address}, from a name server."""
        data = await self._cluster_info()
        return {name: {str(k): v for k, v in (b.get("brokerAddrs") or {}).items()}
                for name, b in (data.get("brokerAddrTable") or {}).items()}

    async def own_names(self) -> set[str]:
        """The names of the brokers and clusters, each the name of a topic the broker keeps
        for itself (remembered in :attr:`known_own` for the checks that cannot wait)."""
        await self._cluster_info()
        return set(self.known_own)

    async def _cluster_info(self) -> dict[str, Any]:
        resp = check(await self.namesrv_call(Req.GET_BROKER_CLUSTER_INFO), "cluster info")
        data: dict[str, Any] = loads_lenient(resp.body)
        names = set(data.get("brokerAddrTable") or {}) | set(data.get("clusterAddrTable") or {})
        if not names <= self.known_own:
            self.known_own = self.known_own | names
        return data

    async def masters(self) -> dict[str, str]:
        return {name: a[MASTER_ID] for name, a in (await self.cluster()).items() if MASTER_ID in a}

    async def topic_names(self) -> list[str]:
        """Every topic the name servers know, in the gateway's spelling."""
        resp = check(await self.namesrv_call(Req.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list")
        return [from_broker_name(t) for t in loads_lenient(resp.body).get("topicList") or []]
