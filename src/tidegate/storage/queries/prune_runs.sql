-- Delete a small batch of runs finished longer ago than the retention period
-- (runs_finished), the webhook requests received as long ago (requests_received), and
-- the rows of workers silent for much longer than a lease.
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
gone AS (
    DELETE FROM workers
    WHERE (SELECT leads FROM leader)
      AND heartbeat_at < now() - make_interval(secs => 10 * %(lease_seconds)s::float8)
    RETURNING id
)
SELECT greatest((SELECT count(*) FROM pruned), (SELECT count(*) FROM pruned_requests)) AS batch,
       (SELECT count(*) FROM gone) AS workers
