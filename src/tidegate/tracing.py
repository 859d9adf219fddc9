"""Spans around enqueue, admission, claim and execute, when OpenTelemetry is installed.

tidegate needs no tracing library. Where ``opentelemetry-api`` is installed (the
``otel`` extra: ``pip install 'tidegate[otel]'``), it opens a span for each of these on
the tracer provider the application configured (an SDK and its exporter, as
OpenTelemetry's documentation shows); with no provider configured the API's spans do
nothing. The attributes carry the names the metrics' labels and the JSON log lines use:

- ``tidegate.enqueue``: ``tidegate.runs`` (how many), ``tidegate.task`` and
  ``tidegate.lane`` of the first.
- ``tidegate.admit``: a webhook, from its arrival to its answer (a sync one's round
  trip): ``tidegate.project``, ``tidegate.trigger``, ``tidegate.mode``,
  ``tidegate.outcome`` and ``http.response.status_code``.
- ``tidegate.claim``: one claim of a workloop: ``tidegate.chain``, ``tidegate.demand``
  and ``tidegate.runs`` (how many it took).
- ``tidegate.execute``: one attempt: ``tidegate.run_id``, ``tidegate.task``,
  ``tidegate.lane``, ``tidegate.key``, ``tidegate.project``, ``tidegate.attempt`` and
  ``tidegate.outcome``; its status is an error when the attempt failed.

A run does not carry its enqueuer's trace context: its execute span starts a trace of
its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

try:
    from opentelemetry import trace
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

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


def span(operation: str, **attributes: str | int) -> AbstractContextManager[Span]:
    """Open the span ``tidegate.<operation>`` for the block (module doc)."""
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return _UNTRACED
    return _opened(operation, attributes)


@contextmanager
def _opened(operation: str, attributes: dict[str, str | int]) -> Iterator[Span]:
    tracer = trace.get_tracer("tidegate")
    names = {_name(k): v for k, v in attributes.items()}
    with tracer.start_as_current_span(PREFIX + operation, attributes=names) as opened:
        yield Span(opened)


def _name(attribute: str) -> str:
    return attribute if "." in attribute else PREFIX + attribute
