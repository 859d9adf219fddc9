-- What a key's circuit breaker is doing, as the API, the CLI, the metrics and the
-- dashboard name it: forced_open or forced_closed (an admin decides), open (its cooldown
-- is running), half_open (an open breaker whose cooldown has passed: the claim lets
-- probes through), closed. Half-open is never stored: it is read from open_until here.
CREATE OR REPLACE FUNCTION breaker_state(b key_breakers) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN b.forced IS NOT NULL THEN 'forced_' || b.forced
        WHEN b.state = 'open' AND b.open_until > now() THEN 'open'
        WHEN b.state = 'open' THEN 'half_open'
        ELSE 'closed'
    END
$$;
