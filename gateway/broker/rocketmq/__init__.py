"""Apache RocketMQ (5.x) over its TCP remoting protocol."""

from .adapter import RocketMQBroker

__all__ = ["RocketMQBroker"]
