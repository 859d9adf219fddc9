-- The circuit breakers that hold ready runs of the given (lane, key) pairs back now:
-- open (its cooldown running), forced open, or half-open (only probes go through). One
-- probe of key_breakers' primary key per pair; a pair without a row has no breaker.
SELECT b.lane, b.key, breaker_state(b) AS breaker, b.open_until
FROM unnest(%(lanes)s::text[], %(keys)s::text[]) AS wanted(lane, key)
JOIN key_breakers AS b ON b.lane = wanted.lane AND b.key = wanted.key
WHERE breaker_state(b) IN ('open', 'forced_open', 'half_open')
