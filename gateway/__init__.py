"""mq-gateway: a stateless HTTP gateway for message brokers.

Every gateway node can serve every request: consumer offsets, locks and
metadata live in Redis, broker clients are long-lived per process, and a node
can be killed at any moment without losing anything.
"""

# Before anything else of the gateway runs: 3.11's asyncio.wait_for loses cancellations (aio.py).
from . import aio as _aio  # noqa: F401

__version__ = "0.1.0"
