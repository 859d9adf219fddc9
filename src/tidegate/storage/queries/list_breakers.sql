-- The circuit breakers that are not plainly closed, most urgent first: open, half-open
-- and forced ones, and closed ones counting failures in their window. Each with its
-- probes in flight (runs_running: a few per worker slot).
SELECT b.lane, b.key, breaker_state(b) AS state, b.open_until, b.opened_at,
       b.cooldown_seconds, b.failures, b.attempts, b.window_started_at, b.trips,
       (SELECT count(*) FROM runs
        WHERE runs.lane = b.lane AND runs.key = b.key AND runs.state = 'running'
          AND runs.probe) AS probes_in_flight,
       b.updated_at
FROM key_breakers b
WHERE (%(lane)s::text IS NULL OR b.lane = %(lane)s)
  AND (b.state = 'open' OR b.forced IS NOT NULL OR b.failures > 0)
ORDER BY breaker_state(b) = 'closed', b.open_until NULLS LAST, b.lane, b.key
LIMIT %(limit)s
