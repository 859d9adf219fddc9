-- Delete a small batch of runs finished longer ago than the retention period
-- (runs_finished) with their progress events, the webhook requests received as long
-- ago (requests_received) and the webhook log's other requests (request_log_received),
-- the per-minute counts older than the dashboard's hour, and the rows of workers silent
-- for much longer than a lease.
-- One process at a time: whoever takes the transaction-scoped advisory lock prunes,
-- the others find it taken and skip this round.
WITH leader AS (
    SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.prune')) AS leads
),
old AS (
    SELECT id FROM runs
    WHERE (SELECT leads FROM leader)
      AND state IN ('succeeded', 'discarded', 'cancelled')
      AND completed_at < now() - make_interval(secs => %(retention_seconds)s::float8)
    ORDER BY completed_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
pruned AS (
    DELETE FROM runs USING old WHERE runs.id = old.id RETURNING runs.id
),
pruned_events AS (  -- runs at once, as every data-modifying CTE does
    DELETE FROM run_events USING pruned WHERE run_events.run_id = pruned.id
),
old_requests AS (
    SELECT id FROM requests
    WHERE (SELECT leads FROM leader)
      AND received_at < now() - make_interval(secs => %(retention_seconds)s::float8)
    ORDER BY received_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
pruned_requests AS (
    DELETE FROM requests USING old_requests WHERE requests.id = old_requests.id
    RETURNING requests.id
),
old_log AS (
    SELECT id FROM request_log
    WHERE (SELECT leads FROM leader)
      AND received_at < now() - make_interval(secs => %(retention_seconds)s::float8)
    ORDER BY received_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
),
pruned_log AS (
    DELETE FROM request_log USING old_log WHERE request_log.id = old_log.id
    RETURNING request_log.id
),
old_minutes AS (
    DELETE FROM minute_counts
    WHERE (SELECT leads FROM leader) AND minute < now() - interval '1 hour'
    RETURNING 1
),
gone AS (
    DELETE FROM workers
    WHERE (SELECT leads FROM leader)
      AND heartbeat_at < now() - make_interval(secs => 10 * %(lease_seconds)s::float8)
    RETURNING id
)
SELECT greatest(
           (SELECT count(*) FROM pruned),
           (SELECT count(*) FROM pruned_requests),
           (SELECT count(*) FROM pruned_log)
       ) AS batch,
       (SELECT count(*) FROM old_minutes) AS minutes,
       (SELECT count(*) FROM gone) AS workers
