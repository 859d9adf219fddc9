-- Set a key's policy in a lane (key '*': the lane's default), changing only the fields
-- named in the patch; a JSON null clears a field (it falls back to the lane's default).
-- Claims read it: it holds for the next claim.
INSERT INTO key_policies AS p (lane, key, max_running, weight, rate, rate_burst)
VALUES (
    %(lane)s, %(key)s,
    (%(patch)s::jsonb ->> 'max_running')::integer,
    (%(patch)s::jsonb ->> 'weight')::float8,
    (%(patch)s::jsonb ->> 'rate')::float8,
    (%(patch)s::jsonb ->> 'rate_burst')::integer
)
ON CONFLICT (lane, key) DO UPDATE SET
    max_running = CASE WHEN %(patch)s::jsonb ? 'max_running' THEN excluded.max_running
                       ELSE p.max_running END,
    weight = CASE WHEN %(patch)s::jsonb ? 'weight' THEN excluded.weight ELSE p.weight END,
    rate = CASE WHEN %(patch)s::jsonb ? 'rate' THEN excluded.rate ELSE p.rate END,
    rate_burst = CASE WHEN %(patch)s::jsonb ? 'rate_burst' THEN excluded.rate_burst
                      ELSE p.rate_burst END,
    updated_at = now()
RETURNING lane, key, max_running, weight, rate, rate_burst, updated_at
