-- The trace context of what made a run (tidegate.tracing): the W3C `traceparent` and
-- `tracestate` of the enqueue's span, or of a webhook's sender; NULL where there was
-- none, which costs nothing past the null bitmap. A nullable column without a default
-- rewrites nothing.
ALTER TABLE runs ADD COLUMN trace_context jsonb;
