"""Optional OpenTelemetry spans for produce, fetch, ack and the delay relay (``otel_tracing``,
off by default).

Off, no OpenTelemetry module is imported and a call site costs one shared no-op context
manager (measured: BENCHMARKS.md, "Trace context and spans"). On, each span follows the
messaging conventions: a produce is a PRODUCER span, child of the request's ``traceparent``,
and its own context is what the records carry (so a consumer's span can link to the produce
that wrote a record); a fetch is a CONSUMER span, child of the fetch request's context, linked
to the context of each record it returns; an ack a CLIENT span; a relay pass an INTERNAL span
linked to the records it moved. Spans go to the process's tracer provider: the one
``opentelemetry-instrument`` (or the application) set up, else one made here that exports by
OTLP over HTTP when that exporter is installed (``OTEL_EXPORTER_OTLP_ENDPOINT``, standard
variables).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from ..broker import Record
from .trace import TRACEPARENT, TRACESTATE

log = logging.getLogger("mqgw")
#: Records a fetch or relay span links to at most (a span's links are held in memory).
MAX_LINKS = 32


class Span:
    """What a call site does with its span: the no-op one when tracing is off."""

    def headers(self) -> list[tuple[str, bytes]]:
        """The span's context as record headers (none when off)."""
        return []

    def link(self, records: Sequence[Record]) -> None:
        """Link the span to the trace context each record carries."""

    def set(self, name: str, value: Any) -> None:
        """An attribute of the span."""


_OFF = Span()
_OFF_CONTEXT: AbstractContextManager[Span] = nullcontext(_OFF)


class _Live(Span):
    def __init__(self, spans: Spans, span: Any) -> None:
        self.spans, self.span = spans, span

    def headers(self) -> list[tuple[str, bytes]]:
        carrier: dict[str, str] = {}
        self.spans.propagator.inject(carrier, context=self.spans.api.set_span_in_context(self.span))
        return [(k, v.encode()) for k, v in carrier.items() if k in (TRACEPARENT, TRACESTATE)]

    def link(self, records: Sequence[Record]) -> None:
        for r in records[:MAX_LINKS]:
            carrier = {n: v.decode(errors="replace") for n, v in r.headers
                       if n in (TRACEPARENT, TRACESTATE) and v}
            if carrier:
                ctx = self.spans.api.get_current_span(self.spans.propagator.extract(carrier))
                if ctx.get_span_context().is_valid:
                    self.span.add_link(ctx.get_span_context())

    def set(self, name: str, value: Any) -> None:
        self.span.set_attribute(name, value)


class Spans:
    def __init__(self, enabled: bool, broker: str = "", provider: Any = None) -> None:
        """``provider``: a tracer provider of the caller's (tests), else the process's."""
        self.on = enabled
        self.system = broker
        if not enabled:
            return
        try:
            from opentelemetry import trace as api
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise RuntimeError("otel_tracing needs the OpenTelemetry packages: pip install "
                               "'mq-gateway[otel]' (opentelemetry-api, -sdk, and the OTLP "
                               "exporter)") from None
        self.api = api
        self.propagator = TraceContextTextMapPropagator()
        self.kinds = {"producer": api.SpanKind.PRODUCER, "consumer": api.SpanKind.CONSUMER,
                      "client": api.SpanKind.CLIENT, "internal": api.SpanKind.INTERNAL}
        self.tracer = (provider or _provider(api)).get_tracer("mq-gateway")

    def span(self, name: str, kind: str, parent: Sequence[tuple[str, bytes]] = (),
             attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Span]:
        """A span around a block (the shared no-op one when off); ``parent``: a request's trace
        context as record headers (core/trace.py), the span's parent."""
        if not self.on:
            return _OFF_CONTEXT
        return self._span(name, kind, parent, attributes)

    @contextmanager
    def _span(self, name: str, kind: str, parent: Sequence[tuple[str, bytes]],
              attributes: Mapping[str, Any] | None) -> Iterator[Span]:
        ctx = self.propagator.extract({n: v.decode() for n, v in parent}) if parent else None
        attrs = {"messaging.system": self.system, **(attributes or {})}
        with self.tracer.start_as_current_span(name, context=ctx, kind=self.kinds[kind],
                                               attributes=attrs) as span:
            yield _Live(self, span)


def _provider(api: Any) -> Any:
    """The process's tracer provider; if nobody set one up, one that exports by OTLP over HTTP
    (when installed), else a warning that spans go nowhere."""
    current = api.get_tracer_provider()
    if type(current).__name__ != "ProxyTracerProvider":  # set up already (opentelemetry-instrument)
        return current
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("otel_tracing is on but no tracer provider is set up and the OTLP exporter "
                    "is not installed: spans go nowhere (pip install 'mq-gateway[otel]', or run "
                    "under opentelemetry-instrument)")
        return current
    provider = TracerProvider(resource=Resource.create({"service.name": "mq-gateway"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    api.set_tracer_provider(provider)
    return provider
