-- Record the outcomes of a batch of attempts in one statement.
--
-- The guard (still running, same attempt, same worker) keeps a late outcome from
-- overwriting: a run that was rescued and claimed again, or cancelled meanwhile, keeps
-- its newer state. The ids returned are the outcomes recorded; the worker notes the
-- others in their runs' errors (note_late_outcomes.sql); rows without an id tell of
-- circuit breakers that opened or closed. A retry goes back to
-- 'scheduled' with its delay; the stager makes it available when due. Finished
-- fast-lane runs, and runs whose events someone reads (watched), NOTIFY their id for a
-- waiting caller.
-- Progress events (run.progress) come first, in the same statement, written only while
-- their attempt still holds the run on this worker; each run with new events NOTIFYs
-- 'e' || its id. The outcomes' UPDATE reads the runs as they were before the statement,
-- so a run's last events and its outcome are written together.
-- The batch arrives as one JSON array of objects: one parameter, parsed in C.
-- A function, so that a remote worker's claim (claim_workloop) writes its outcomes in
-- the statement that claims.
CREATE OR REPLACE FUNCTION complete_runs(
    p_worker_id text,
    p_completed_channel text,
    p_channel text,
    p_outcomes jsonb,
    p_events jsonb
)
RETURNS TABLE (id bigint, lane text, key text, change text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH event AS (
        SELECT e.run_id, e.attempt, e.data, e.n
        FROM ROWS FROM (
                 jsonb_to_recordset(p_events) AS (run_id bigint, attempt smallint, data text)
             ) WITH ORDINALITY AS e(run_id, attempt, data, n)
        JOIN runs ON runs.id = e.run_id
                 AND runs.attempt = e.attempt
                 AND runs.state = 'running'
                 AND runs.worker_id = p_worker_id
    ),
    -- A data-modifying CTE runs to the end whatever reads it: the NOTIFYs ride on its
    -- RETURNING (one per run: PostgreSQL folds equal notifications of a transaction).
    reported AS (
        INSERT INTO run_events (run_id, attempt, data)
        SELECT run_id, attempt, data::jsonb FROM event ORDER BY n
        RETURNING pg_notify(p_completed_channel, 'e' || run_id)
    ),
    outcome AS (
        SELECT * FROM jsonb_to_recordset(p_outcomes) AS o(
            id bigint, attempt smallint, state run_state, result text, error text,
            delay_seconds float8, max_attempts integer, verdict text
        )
    ),
    done AS (
        UPDATE runs
        SET state = outcome.state,
            result = outcome.result::jsonb,
            errors = CASE WHEN outcome.error IS NULL THEN runs.errors
                          ELSE runs.errors || jsonb_build_array(outcome.error::jsonb) END,
            -- A worker raises max_attempts only to give an attempt back (Retry, and
            -- DownstreamFailing without a reply: worker/execute.py), by one, as the run goes
            -- back to 'scheduled'; it never lowers it. A remote worker's batch says what it
            -- likes, so the rule is kept here: within [max_attempts, max_attempts + 1] for a
            -- run scheduled again, unchanged otherwise, and within smallint.
            max_attempts = CASE WHEN outcome.state = 'scheduled'
                                THEN least(greatest(outcome.max_attempts, runs.max_attempts),
                                           runs.max_attempts + 1, 32767)
                                ELSE runs.max_attempts END,
            scheduled_at = CASE WHEN outcome.state = 'scheduled'
                                THEN now() + make_interval(secs => outcome.delay_seconds)
                                ELSE runs.scheduled_at END,
            completed_at = CASE WHEN outcome.state IN ('succeeded', 'discarded', 'cancelled')
                                THEN now() END,
            lease_expires_at = NULL
        FROM outcome
        WHERE runs.id = outcome.id
          AND runs.attempt = outcome.attempt
          AND runs.state = 'running'
          AND runs.worker_id = p_worker_id
        RETURNING runs.id, runs.lane, runs.key, runs.state, runs.probe, runs.watched,
                  runs.attempted_at, outcome.verdict
    ),
    notified AS (
        SELECT count(pg_notify(p_completed_channel, id::text)) AS runs
        FROM done WHERE (lane = 'fast_lane' OR watched) AND state <> 'scheduled'
    ),
    -- A finished run frees its key's place: where limits are set, claimers of its lane on
    -- every worker look again (a key at max_running is gated, not idle).
    freed AS (
        SELECT count(pg_notify(p_channel, lane)) AS lanes
        FROM (SELECT DISTINCT lane FROM done) AS lanes
        WHERE EXISTS (SELECT 1 FROM key_policies)
           OR EXISTS (SELECT 1 FROM projects WHERE concurrency IS NOT NULL)
    ),
    -- Circuit breakers (function count_breaker_outcomes): the outcomes that tell of a
    -- downstream (verdict 'success' or 'failure'), by key, counted where any breaker policy
    -- is set, in (lane, key) order so that completions lock breaker rows in one order; of a
    -- half-open breaker's probes, when the newest that succeeded and that failed were
    -- claimed (a probe speaks only for the round it was claimed in). Where one opens or
    -- closes, the change comes back beside the ids, for the worker's log.
    told AS MATERIALIZED (
        SELECT lane, key,
               count(*) FILTER (WHERE verdict = 'success')::integer AS successes,
               count(*) FILTER (WHERE verdict = 'failure')::integer AS failures,
               max(attempted_at) FILTER (WHERE verdict = 'success' AND probe) AS probe_succeeded_at,
               max(attempted_at) FILTER (WHERE verdict = 'failure' AND probe) AS probe_failed_at
        FROM done
        WHERE verdict IS NOT NULL
          AND EXISTS (SELECT 1 FROM key_policies
                      WHERE breaker_failures IS NOT NULL OR breaker_ratio IS NOT NULL)
        GROUP BY lane, key
        ORDER BY lane, key
    ),
    breakers AS (
        SELECT lane, key, count_breaker_outcomes(
                   lane, key, successes, failures, probe_succeeded_at, probe_failed_at) AS change
        FROM told
    ),
    -- Outcomes commit without waiting for the WAL flush (the batch is not held back by the
    -- disk): a crash may lose the last of them, and each such run, still leased, lapses and
    -- runs again, its attempt counted and the lapse in its errors (docs/guarantees.md). The
    -- last branch below reads this, so it is evaluated, and returns no row.
    lazily AS MATERIALIZED (
        SELECT set_config('synchronous_commit', 'off', true) AS commit_mode
    )
    SELECT done.id, NULL AS lane, NULL AS key, NULL AS change
    FROM done, notified, freed
    UNION ALL
    SELECT NULL, lane, key, change FROM breakers WHERE change IS NOT NULL
    UNION ALL
    SELECT NULL, NULL, NULL, NULL FROM lazily WHERE commit_mode IS NULL;
END
$$;
