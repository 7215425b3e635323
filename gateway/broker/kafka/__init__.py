"""Apache Kafka adapter (confluent-kafka / librdkafka)."""

from .adapter import KafkaBroker

__all__ = ["KafkaBroker"]
