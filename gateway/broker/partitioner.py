"""Which partition a keyed record goes to: the rule of Kafka's Java client, for every adapter.

Per-key ordering holds only while every writer of a topic puts a key on the same partition.
Most writers of a Kafka topic are Java clients (and the Confluent REST Proxy, Kafka Connect,
Kafka Streams, which are Java), whose default partitioner sends a keyed record to
``toPositive(murmur2(keyBytes)) % numPartitions`` (``Utils.murmur2`` in kafka-clients).
librdkafka's own default (``consistent_random``, a CRC32 of the key) puts most keys elsewhere,
so the Kafka adapter asks librdkafka for its Java-compatible partitioner
(:data:`LIBRDKAFKA_PARTITIONER`), and the in-memory broker uses :func:`partition_for_key`.
The gateway itself never picks a partition for a key: every path that writes a keyed record
(``/produce``, the delay wheel's delivery, retries, redrives) leaves it to the adapter, so they
all agree. Keyless records are spread at random (Java's sticky partitioner fills one partition
per batch instead; neither promises an order).
"""

from __future__ import annotations

#: librdkafka's name for the Java client's rule: murmur2 of the key, keyless records at random.
LIBRDKAFKA_PARTITIONER = "murmur2_random"

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: MurmurHash2 (seed 0x9747b28c) as a signed 32-bit int, byte for
    byte what the Java client computes (Java ints wrap; here every step is masked to 32 bits)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition the Java client's default partitioner gives ``key`` in a topic of
    ``partitions`` partitions (``Utils.toPositive(Utils.murmur2(key)) % partitions``)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
