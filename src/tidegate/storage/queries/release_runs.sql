-- Hand back runs a stopping worker could not finish in its grace period: 'available'
-- again, the interrupted attempt not counted, and their lanes woken.
WITH released AS (
    UPDATE runs
    SET state = 'available', attempt = attempt - 1, lease_expires_at = NULL,
        vtime = greatest(vtime, coalesce(lane_frontier(lane), vtime))
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running' AND worker_id = %(worker_id)s
    RETURNING lane
),
notified AS (
    SELECT count(pg_notify(%(channel)s, lane)) AS lanes
    FROM (SELECT DISTINCT lane FROM released) AS ready
)
SELECT (SELECT count(*) FROM released) AS released FROM notified
