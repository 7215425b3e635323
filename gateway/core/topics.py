"""Topics as the admin API shows and creates them: what exists, and whose it is.

A gateway deployment needs its topics made before anything is produced, and the gateway
refuses to create them implicitly (a typo in ``/produce`` must not make a topic). This is the
way to look at them and to make them without a Kafka tool.

Whose a topic is decides whether a listing shows it (the rule is :class:`.names.InternalTopics`,
the one ``/produce``'s ``403 internal_topic`` follows):
- the gateway's own (the delay wheel's levels and the consumers' retry topics) carry records in
  a form only the gateway reads; they are hidden, and cannot be created here;
- the broker's own (Kafka's ``__consumer_offsets``, RocketMQ's ``rmq_sys_wheel_timer``: each
  adapter's :meth:`Broker.owns_topic` and :attr:`TopicInfo.internal`) are hidden too, and
  cannot be created here either;
- dead-letter topics (``mqgw.dead.<consumer>`` or the one a retry policy names) are not
  internal: the gateway writes them, but they hold the user's records as they were, operators
  read them and consumers may consume them.
``internal=True`` lists everything, each topic saying whether it is internal.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..broker import Broker, QueueInfo, TopicExists, TopicInfo, TopicRefused
from ..config import Settings
from .errors import Conflict, denied, invalid
from .names import InternalTopics, check_topic
from .watermarks import Watermarks

#: More partitions than this in one request is taken for a typo: each costs the brokers files,
#: memory and leader work, and Kafka cannot remove partitions again.
MAX_PARTITIONS = 10_000
#: Kafka's replication factor is a 16-bit field, but librdkafka refuses more than 10,000 before
#: asking (a ValueError, which answered 500 to a fuzzer's 32767); no cluster has that many.
MAX_REPLICATION = 10_000


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    queues: tuple[QueueInfo, ...]
    #: Hidden from listings unless asked for: the gateway's own or the broker's own.
    internal: bool

    @property
    def replication(self) -> int | None:
        """Copies of each queue (of the first; Kafka keeps them alike), None if unknown."""
        return len(self.queues[0].replicas) if self.queues and self.queues[0].replicas else None


class TopicService:
    def __init__(self, settings: Settings, broker: Broker, watermarks: Watermarks | None = None) -> None:
        self.broker = broker
        self.internal = InternalTopics.of(settings, broker.owns_topic)
        self.watermarks = watermarks

    def _view(self, info: TopicInfo) -> Topic:
        return Topic(info.name, info.queues,
                     info.internal or info.name in self.internal)

    async def list(self, include_internal: bool = False) -> list[Topic]:
        """Every topic (the internal ones only with ``include_internal``), sorted by name."""
        views = [self._view(t) for t in await self.broker.describe_topics()]
        return sorted((t for t in views if include_internal or not t.internal), key=lambda t: t.name)

    async def describe(self, name: str) -> Topic:
        """One topic, internal or not; :class:`~gateway.broker.UnknownTopic` if there is none."""
        check_topic(name)
        return self._view((await self.broker.describe_topics([name]))[0])

    async def create(self, name: str, partitions: int, replication: int | None) -> Topic:
        """Create a topic and answer it as :meth:`describe` does, once every partition serves.
        ``replication`` None: the broker's default."""
        check_topic(name)
        if name in self.internal:
            raise denied("internal_topic", f"topic {name!r} would be one of the gateway's own "
                         "(delay levels, retry topics, made by the gateway when needed), or "
                         "collide with one, or be the broker's")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise invalid("invalid_partitions", f"partitions must be an integer from 1 to "
                          f"{MAX_PARTITIONS}", min=1, max=MAX_PARTITIONS)
        if replication is not None and not 1 <= replication <= MAX_REPLICATION:
            raise invalid("invalid_replication_factor", "replicationFactor must be an integer "
                          f"from 1 to {MAX_REPLICATION}, or null for the broker's default",
                          min=1, max=MAX_REPLICATION)
        try:
            await self.broker.create_topic(name, partitions, replication)
        except TopicExists:
            raise Conflict("topic_exists", f"topic {name!r} exists already") from None
        except TopicRefused as e:
            if e.code == "not_authorized":
                raise denied("broker_denied", f"the broker does not let the gateway create "
                             f"topic {name!r}: {e.message}") from None
            raise invalid(e.code, f"the broker refused to create topic {name!r}: "
                          f"{e.message}") from None
        if self.watermarks is not None:
            self.watermarks.created(name)  # a /message that just found it missing: not any more
        return await self.describe(name)
