-- The trace context a webhook's sender sent (W3C Trace Context headers, kept with the
-- request): what its run's attempts link to (tidegate.tracing); NULL without one.
-- SQL, one expression: admit_webhook's inserts inline it.
CREATE OR REPLACE FUNCTION trace_context_of(p_headers jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_headers ? 'traceparent' THEN jsonb_strip_nulls(jsonb_build_object(
        'traceparent', p_headers -> 'traceparent', 'tracestate', p_headers -> 'tracestate'
    )) END
$$;
