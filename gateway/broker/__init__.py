"""Broker adapters behind one small interface (:class:`gateway.broker.base.Broker`)."""

from .base import Broker, FetchResult, OutgoingMessage, ProduceResult, Record, UnknownTopic

__all__ = ["Broker", "FetchResult", "OutgoingMessage", "ProduceResult", "Record", "UnknownTopic"]
