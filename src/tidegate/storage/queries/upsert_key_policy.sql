-- Set a key's policy in a lane (key '*': the lane's default), changing only the fields
-- named in the patch; a JSON null clears a field (it falls back to the lane's default).
-- jsonb_populate_record lays the patch over a row: the new one's NULLs, or the stored
-- row, so that fields the patch does not name keep their value. Claims read it: it
-- holds for the next claim.
INSERT INTO key_policies AS p
SELECT (jsonb_populate_record(
    NULL::key_policies,
    %(patch)s::jsonb || jsonb_build_object('lane', %(lane)s::text, 'key', %(key)s::text,
                                           'updated_at', now())
)).*
ON CONFLICT (lane, key) DO UPDATE SET
    (max_running, weight, rate, rate_burst, breaker_failures, breaker_ratio,
     breaker_min_attempts, breaker_window_seconds, breaker_cooldown_seconds,
     breaker_max_cooldown_seconds, breaker_probes, ordered, updated_at)
    = (SELECT patched.max_running, patched.weight, patched.rate, patched.rate_burst,
              patched.breaker_failures, patched.breaker_ratio, patched.breaker_min_attempts,
              patched.breaker_window_seconds, patched.breaker_cooldown_seconds,
              patched.breaker_max_cooldown_seconds, patched.breaker_probes, patched.ordered,
              now()
       FROM jsonb_populate_record(p, %(patch)s::jsonb) AS patched)
RETURNING p.*
