-- Return the runs whose lease ran out (their worker died or hung) to 'available', the
-- attempt counted, or discard them when no attempt is left (runs_running); count them
-- in the metrics' attempts (worker_counters, as 'retired''s, and this minute's charts),
-- whichever process rescues (a worker, or an API process when no worker is left); return
-- how many by task and lane.
-- The state guard and SKIP LOCKED make each run rescued once, even with several
-- rescuers; a late completion by the lost worker is then a no-op (complete_runs).
-- A lease counts as lapsed at the transaction's start, not at the time of the read: a
-- rescue that waited for a lock (a table locked for seconds, while heartbeats could not
-- renew either) takes none of the leases that ran out meanwhile; the heartbeats that
-- waited with it renew them as they get through.
WITH expired AS (
    SELECT id FROM runs
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
rescued AS (
    UPDATE runs
    SET state = CASE WHEN runs.attempt >= runs.max_attempts THEN 'discarded'
                     ELSE 'available' END::run_state,
        completed_at = CASE WHEN runs.attempt >= runs.max_attempts THEN now() END,
        errors = runs.errors || jsonb_build_array(jsonb_build_object(
            'attempt', runs.attempt,
            'at', now(),
            'error', 'lease expired: worker ' || coalesce(runs.worker_id, '?')
                     || ' stopped renewing it'
        )),
        lease_expires_at = NULL,
        probe = false,  -- a rescued probe frees its half-open breaker's place
        -- Back in line where claiming has got to, not behind its key's whole backlog.
        vtime = greatest(runs.vtime, coalesce(lane_frontier(runs.lane), runs.vtime))
    FROM expired WHERE runs.id = expired.id
    RETURNING runs.id, runs.task, runs.lane, runs.state, runs.watched
),
notified AS (
    SELECT count(pg_notify(%(channel)s, lane)) AS lanes
    FROM (SELECT DISTINCT lane FROM rescued WHERE state = 'available') AS ready
),
finished AS (
    SELECT count(pg_notify(%(completed_channel)s, id::text)) AS runs
    FROM rescued WHERE (lane = 'fast_lane' OR watched) AND state = 'discarded'
),
by_series AS MATERIALIZED (
    SELECT task, lane, count(*) AS rescued FROM rescued GROUP BY task, lane
),
-- Rescued attempts have no handler time: every bucket of their histogram is empty.
-- Both tables in (task, lane) order, as every other writer of them, so none deadlock.
counted AS (
    INSERT INTO worker_counters AS c (worker_id, task, lane, outcome, attempts, seconds, buckets)
    SELECT 'retired', task, lane, 'rescued', rescued, 0,
           array_fill(0::bigint, ARRAY[%(buckets)s::integer])
    FROM by_series
    ORDER BY task, lane
    ON CONFLICT (worker_id, task, lane, outcome) DO UPDATE
    SET attempts = c.attempts + excluded.attempts
),
minutes AS (
    INSERT INTO minute_counts AS m (minute, source, project, lane, task, outcome, count)
    SELECT date_trunc('minute', now()), 'attempt', '', lane, task, 'rescued', rescued
    FROM by_series
    ORDER BY lane, task
    ON CONFLICT (minute, source, project, lane, task, outcome) DO UPDATE
    SET count = m.count + excluded.count
)
SELECT by_series.task, by_series.lane, by_series.rescued
FROM by_series, notified, finished
