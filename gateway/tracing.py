"""OpenTelemetry tracing, optional: `pip install 'selfroute[otel]'`, then `selfroute serve --otel` (or any of the
standard OTEL_* variables, e.g. OTEL_EXPORTER_OTLP_ENDPOINT) exports a span per HTTP request
(gateway.server.tracing_middleware) with child spans for the routing plan, the prompt's preparation (retrieval and
packing), each upstream leg and the answer check (verifier), over OTLP/HTTP.

Off (the default), nothing here runs per request but a check of one module global: `span()` hands back a shared
no-op context manager and the request middleware is not even installed. The opentelemetry packages are imported
only by `configure`, never with the gateway."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

TRACER_NAME = "selfroute"
_NULL = contextlib.nullcontext()
_tracer: Any = None  # an opentelemetry Tracer while tracing is on


def enabled() -> bool:
    return _tracer is not None


def wanted(flag: bool) -> bool:
    """--otel, or an OTLP exporter configured through the standard variables (and not disabled by OTEL_SDK_DISABLED)."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return flag or any(
        name in os.environ
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER")
    )


class TracingUnavailable(RuntimeError):
    """--otel without the opentelemetry packages."""


def configure(provider: Any = None) -> None:
    """Turn tracing on: with `provider` (tests pass an SDK TracerProvider with an in-memory exporter), else an SDK
    provider exporting over OTLP/HTTP as the OTEL_* variables say (service name from OTEL_SERVICE_NAME, else
    selfroute). Raises TracingUnavailable when the extra is not installed."""
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TracingUnavailable("tracing needs the otel extra: pip install 'selfroute[otel]'") from exc
    if provider is None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise TracingUnavailable("tracing needs the otel extra: pip install 'selfroute[otel]'") from exc
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", TRACER_NAME)})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer(TRACER_NAME)


def disable() -> None:
    global _tracer
    _tracer = None


def span(name: str, **attributes: Any):
    """A child span of the current one while tracing is on (a context manager yielding the span), else a shared
    no-op context manager yielding None."""
    if _tracer is None:
        return _NULL
    return _tracer.start_as_current_span(name, attributes=_clean(attributes))


def start_span(name: str, **attributes: Any):
    """A child span of the current one that the caller ends (a stream's leg ends when the stream does), else None."""
    if _tracer is None:
        return None
    return _tracer.start_span(name, attributes=_clean(attributes))


def server_span(name: str, context: Any = None):
    """The request's span (tracing must be on), a child of `context` (the caller's, from its traceparent)."""
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(name, context=context, kind=SpanKind.SERVER)


def set_attributes(target: Any, **attributes: Any) -> None:
    if target is not None:
        target.set_attributes(_clean(attributes))


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    # OpenTelemetry takes str, bool, int and float (and sequences of them); None is left out
    return {key: value for key, value in attributes.items() if value is not None}
