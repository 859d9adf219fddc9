-- Force a key's breaker open or closed, whatever its policy says, until released
-- (release_breaker.sql). The claim reads it at its next candidate of the key.
INSERT INTO key_breakers AS b (lane, key, forced)
VALUES (%(lane)s, %(key)s, %(force)s)
ON CONFLICT (lane, key) DO UPDATE SET forced = excluded.forced, updated_at = now()
RETURNING b.lane, b.key, breaker_state(b) AS state, b.open_until, b.failures, b.trips,
          b.updated_at
