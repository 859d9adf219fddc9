-- One key's circuit breaker in a lane, as list_breakers.sql shows each (the dashboard's
-- page to force it): its primary key. No row: closed, counting nothing.
SELECT b.lane, b.key, breaker_state(b) AS state, b.forced, b.open_until, b.failures,
       b.attempts, b.trips, b.updated_at
FROM key_breakers b
WHERE b.lane = %(lane)s::text AND b.key = %(key)s::text
