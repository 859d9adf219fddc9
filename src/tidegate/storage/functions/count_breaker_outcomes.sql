-- Count a batch's outcomes of one key for its circuit breaker, and open or close it;
-- return what changed ('opened', 'reopened', 'closed') or NULL.
--
-- Called by complete_runs.sql in (lane, key) order, so two workers' completions lock
-- the breaker rows in the same order; claims never lock them (they read key_breakers,
-- and count probes from the runs). Only outcomes that say something about the downstream
-- come here: successes and failures (exceptions, timeouts, DownstreamFailing), never a
-- Discard (bad input), a Cancel or a Retry. Of a half-open breaker's probes, the batch
-- passes when the newest that succeeded and the newest that failed were claimed.
--   closed     failures (and, for a ratio, attempts) add up in a fixed window of
--              breaker_window_seconds; at breaker_failures, or at breaker_ratio of at
--              least breaker_min_attempts, it opens for breaker_cooldown_seconds. Under a
--              failure count alone, a success on a key without failures writes nothing.
--   open       outcomes of runs claimed before it opened are not news and are ignored;
--              a probe's failure opens it again for twice the cooldown, up to
--              breaker_max_cooldown_seconds; a probe's success closes it. Escalated once
--              per half-open round: a probe speaks only if it was claimed after the
--              breaker last opened, and its outcome is read under the key's lock (below).
--              Without that, with breaker_probes 2, two failed probes written in
--              separate batches took the cooldown 1 -> 2 -> 4 s and the trips 1 -> 3 in
--              one round, and a late probe's success could close a breaker another
--              probe had just reopened.
--   forced     an admin decides: nothing is counted.
-- A row whose key no longer has a breaker policy is deleted. Opening and reopening are
-- stamped with the time of the write (clock_timestamp), not the transaction's start.
CREATE OR REPLACE FUNCTION count_breaker_outcomes(
    p_lane text,
    p_key text,
    p_successes integer,
    p_failures integer,
    p_probe_succeeded_at timestamptz,
    p_probe_failed_at timestamptz
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    policy record;
    b key_breakers%ROWTYPE;
    cooldown float8;
BEGIN
    SELECT coalesce(own.breaker_failures, lane_default.breaker_failures) AS failures,
           coalesce(own.breaker_ratio, lane_default.breaker_ratio) AS ratio,
           coalesce(own.breaker_min_attempts, lane_default.breaker_min_attempts, 10) AS min_attempts,
           coalesce(own.breaker_window_seconds, lane_default.breaker_window_seconds, 60) AS window_seconds,
           coalesce(own.breaker_cooldown_seconds, lane_default.breaker_cooldown_seconds, 30) AS cooldown,
           coalesce(own.breaker_max_cooldown_seconds, lane_default.breaker_max_cooldown_seconds, 600) AS max_cooldown
    INTO policy
    FROM (SELECT) AS one
    LEFT JOIN key_policies own ON own.lane = p_lane AND own.key = p_key
    LEFT JOIN key_policies lane_default ON lane_default.lane = p_lane AND lane_default.key = '*';
    IF policy.failures IS NULL AND policy.ratio IS NULL THEN
        DELETE FROM key_breakers WHERE lane = p_lane AND key = p_key AND forced IS NULL;
        RETURN NULL;
    END IF;
    IF p_failures = 0 AND p_probe_succeeded_at IS NULL AND policy.ratio IS NULL THEN
        RETURN NULL;  -- nothing to count, nothing that could close it
    END IF;
    IF p_probe_succeeded_at IS NOT NULL OR p_probe_failed_at IS NOT NULL THEN
        -- The key's lock, which a claim holds from counting the probes in flight to its
        -- commit: a probe claimed while the breaker was half-open has its claim
        -- committed before this reads the breaker, and one claimed after sees what
        -- this writes. So a probe's claim time tells its round (below).
        PERFORM pg_advisory_xact_lock(hashtextextended('tidegate.key/' || p_lane || '/' || p_key, 0));
    END IF;
    SELECT * INTO b FROM key_breakers WHERE lane = p_lane AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO key_breakers (lane, key) VALUES (p_lane, p_key)
        ON CONFLICT (lane, key) DO NOTHING;
        SELECT * INTO b FROM key_breakers WHERE lane = p_lane AND key = p_key FOR UPDATE;
    END IF;
    IF b.forced IS NOT NULL THEN
        RETURN NULL;
    END IF;

    IF b.state = 'open' THEN
        -- Only probes claimed since it last opened speak for this half-open round: a
        -- probe of an earlier round, whose outcome comes late (its batch was written
        -- after another probe's), neither escalates the cooldown a second time nor
        -- closes a breaker that round's failure has just reopened.
        IF p_probe_failed_at > b.opened_at THEN
            cooldown := least(greatest(2 * b.cooldown_seconds, policy.cooldown),
                              greatest(policy.max_cooldown, policy.cooldown));
            UPDATE key_breakers
            SET opened_at = clock_timestamp(),
                open_until = clock_timestamp() + make_interval(secs => cooldown),
                cooldown_seconds = cooldown, trips = trips + 1, updated_at = now()
            WHERE lane = p_lane AND key = p_key;
            RETURN 'reopened';
        ELSIF p_probe_succeeded_at > b.opened_at THEN
            UPDATE key_breakers
            SET state = 'closed', window_started_at = now(), attempts = 0, failures = 0,
                open_until = NULL, cooldown_seconds = NULL, updated_at = now()
            WHERE lane = p_lane AND key = p_key;
            RETURN 'closed';
        END IF;
        RETURN NULL;
    END IF;

    IF b.window_started_at <= now() - make_interval(secs => policy.window_seconds) THEN
        b.window_started_at := now();
        b.attempts := 0;
        b.failures := 0;
    END IF;
    b.attempts := b.attempts + p_successes + p_failures;
    b.failures := b.failures + p_failures;
    IF p_failures > 0 AND (
        b.failures >= policy.failures
        OR (b.attempts >= policy.min_attempts AND b.failures >= policy.ratio * b.attempts)
    ) THEN
        UPDATE key_breakers
        SET state = 'open', opened_at = clock_timestamp(),
            open_until = clock_timestamp() + make_interval(secs => policy.cooldown),
            cooldown_seconds = policy.cooldown, window_started_at = b.window_started_at,
            attempts = b.attempts, failures = b.failures, trips = trips + 1, updated_at = now()
        WHERE lane = p_lane AND key = p_key;
        RETURN 'opened';
    END IF;
    UPDATE key_breakers
    SET window_started_at = b.window_started_at, attempts = b.attempts, failures = b.failures,
        updated_at = now()
    WHERE lane = p_lane AND key = p_key;
    RETURN NULL;
END
$$;
