"""librdkafka's log lines as the gateway's own structured log lines.

Without a ``logger``, librdkafka writes its lines straight to stderr (``%3|1713881891.083|FAIL|
rdkafka#producer-1| [thrd:…]: … Connect to ipv4#127.0.0.1:9092 failed: Connection refused``),
past the JSON log (gateway/ops/logs.py): a node started while its broker is down printed a raw
line per client. With ``"logger": LOGGER`` in a client's configuration, confluent-kafka hands
each line to :meth:`_Forward.log` instead, as a record of the ``mqgw.kafka`` logger with the
librdkafka facility and client name as fields.

It hands them over only from a call that serves the client's queue (``poll``, ``consume``,
``flush``): the lines wait there until then. The adapter's producers are polled all the time and
its fetch consumers consume; clients that are not (the admin client, the metadata consumer) are
polled by the adapter's poll thread for this alone.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("mqgw.kafka")


#: Warnings librdkafka gives for what it retries by itself and nobody can act on, logged as
#: INFO: (facility, part of the text). A broker just started loads its transaction coordinator
#: for a moment, and each idempotent producer of a node starting then said so (`make run`).
ROUTINE = (("GETPID", "Coordinator load in progress"),)


class _Forward:
    """What confluent-kafka calls: ``log(level, "%s [%s] %s", facility, client, text)``, level
    already a :mod:`logging` level (it maps syslog's 0-7)."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        if len(args) == 3:
            facility, client, text = args
            if level == logging.WARNING and any(
                    facility == f and part in text for f, part in ROUTINE):
                level = logging.INFO
            log.log(level, "%s", text, extra={"facility": facility, "client": client})
        else:  # another binding version's shape: keep the line whatever it is
            log.log(level, msg, *args)


#: The ``logger`` setting of every client the adapter builds.
LOGGER = _Forward()
