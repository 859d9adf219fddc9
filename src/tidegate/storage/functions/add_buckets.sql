-- Two bucket arrays added element by element: the state function of sum_buckets, and
-- how a worker's heartbeat (beat_worker.sql), an API process's ledger
-- (add_ingress_counts.sql) and fold_counters.sql add counts of the same histogram.
CREATE OR REPLACE FUNCTION add_buckets(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT array_agg(x + y ORDER BY i) FROM unnest(a, b) WITH ORDINALITY AS u(x, y, i)
$$;
