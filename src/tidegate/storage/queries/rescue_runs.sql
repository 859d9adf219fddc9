-- Return the runs whose lease ran out (their worker died or hung) to 'available', the
-- attempt counted, or discard them when no attempt is left (runs_running); return how
-- many by task and lane.
-- The state guard and SKIP LOCKED make each run rescued once, even with several
-- rescuers; a late completion by the lost worker is then a no-op (complete_runs).
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
)
-- What was rescued, by task and lane, for the rescuing worker's counters.
SELECT rescued.task, rescued.lane, count(*) AS rescued
FROM rescued, notified, finished
GROUP BY rescued.task, rescued.lane
