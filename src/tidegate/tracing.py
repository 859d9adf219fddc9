"""Spans around enqueue, admission, claim and execute, when OpenTelemetry is installed.

tidegate needs no tracing library. Where ``opentelemetry-api`` is installed (the
``otel`` extra: ``pip install 'tidegate[otel]'``), it opens a span for each of these on
the tracer provider the application configured (an SDK and its exporter, as
OpenTelemetry's documentation shows); with no provider configured the API's spans do
nothing. The attributes carry the names the metrics' labels and the JSON log lines use:

- ``tidegate.enqueue``, a producer span: ``tidegate.runs`` (how many), ``tidegate.task``
  and ``tidegate.lane`` of the first, and OpenTelemetry's messaging attributes
  (``messaging.system`` ``tidegate``, ``messaging.operation.type`` ``send``,
  ``messaging.destination.name`` the lane).
- ``tidegate.admit``: a webhook, from its arrival to its answer (a sync one's round
  trip): ``tidegate.project``, ``tidegate.trigger``, ``tidegate.mode``,
  ``tidegate.outcome`` and ``http.response.status_code``. Its parent is the sender's
  span where the request carries W3C Trace Context headers and no span of the server's
  own is current (an ASGI instrumentation's would be).
- ``tidegate.claim``: one claim of a workloop: ``tidegate.chain``, ``tidegate.demand``
  and ``tidegate.runs`` (how many it took).
- ``tidegate.execute``: one attempt, a consumer span: ``tidegate.run_id``,
  ``tidegate.task``, ``tidegate.lane``, ``tidegate.key``, ``tidegate.project``,
  ``tidegate.attempt`` and ``tidegate.outcome``, and the messaging attributes
  (``messaging.operation.type`` ``process``, ``messaging.message.id`` the run's id); its
  status is an error when the attempt failed.

A run carries the trace context of what made it (``Run.trace_context``, stored with the
run): the enqueue's span, or a webhook sender's ``traceparent``. Each attempt's execute
span starts a trace of its own with a link to that context, as OpenTelemetry's
messaging conventions have a consumer do: an attempt may run minutes after the enqueue,
several times, and on another machine, so it is linked to the producer, not its child.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # the otel extra is not installed
    propagate = trace = None  # type: ignore[assignment]

PREFIX = "tidegate."
STATUS_ATTRIBUTE = "http.response.status_code"
"""OpenTelemetry's name for an HTTP answer's status."""


class Span:
    """The span of one operation, or nothing where OpenTelemetry is not installed."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def note(self, **attributes: str | int) -> None:
        """Add attributes, named as in the metrics (``outcome="succeeded"``)."""
        if self.span is not None:
            self.span.set_attributes({_name(k): v for k, v in attributes.items()})

    def failed(self, description: str) -> None:
        if self.span is not None:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, description))


_UNTRACED = nullcontext(Span(None))
"""What ``span`` gives where no provider is configured: the API's spans would do
nothing, at a cost per run (a generator per block, 2-3% of a worker's CPU in a drain)."""


def span(
    operation: str,
    *,
    kind: str | None = None,
    link: Mapping[str, str] | None = None,
    parent: Mapping[str, str] | None = None,
    **attributes: str | int,
) -> AbstractContextManager[Span]:
    """Open the span ``tidegate.<operation>`` for the block (module doc).

    ``kind`` names its ``SpanKind`` (``"producer"``, ``"consumer"``); ``link`` is a
    stored trace context (``carrier``'s) to link to; ``parent`` is one to start under
    (a request's headers) where no span is current.
    """
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return _UNTRACED
    return _opened(operation, kind, link, parent, attributes)


def carrier() -> dict[str, str] | None:
    """The current span's trace context as the configured propagator writes it (W3C's
    ``traceparent`` and ``tracestate`` by default), to store with a run; ``None`` where
    no span is current."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    written: dict[str, str] = {}
    propagate.inject(written)
    return written or None


@contextmanager
def _opened(
    operation: str,
    kind: str | None,
    link: Mapping[str, str] | None,
    parent: Mapping[str, str] | None,
    attributes: dict[str, str | int],
) -> Iterator[Span]:
    tracer = trace.get_tracer("tidegate")
    options: dict[str, Any] = {"attributes": {_name(k): v for k, v in attributes.items()}}
    if kind is not None:
        options["kind"] = trace.SpanKind[kind.upper()]
        options["attributes"].update(_messaging(kind, attributes))
    if link is not None:
        linked = trace.get_current_span(propagate.extract(link)).get_span_context()
        if linked.is_valid:  # a context a sender made up is ignored, not an error
            options["links"] = [trace.Link(linked)]
    if parent is not None and not trace.get_current_span().get_span_context().is_valid:
        options["context"] = propagate.extract(parent)
    with tracer.start_as_current_span(PREFIX + operation, **options) as opened:
        yield Span(opened)


def _messaging(kind: str, attributes: dict[str, str | int]) -> dict[str, str]:
    """OpenTelemetry's messaging attributes of a producer's or a consumer's span."""
    named = {
        "messaging.system": "tidegate",
        "messaging.operation.type": "send" if kind == "producer" else "process",
        "messaging.destination.name": str(attributes.get("lane", "")),
    }
    if "run_id" in attributes:
        named["messaging.message.id"] = str(attributes["run_id"])
    return named


def _name(attribute: str) -> str:
    return attribute if "." in attribute else PREFIX + attribute
