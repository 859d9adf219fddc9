-- Run a finished run again, in the lane the caller names ('manual' for one run):
-- 'available' at once, with one more attempt allowed if it had spent them all.
WITH retried AS (
    UPDATE runs
    SET state = 'available', lane = %(lane)s, scheduled_at = now(), completed_at = NULL,
        max_attempts = greatest(max_attempts, attempt + 1)
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('succeeded', 'discarded', 'cancelled')
    RETURNING *
),
notified AS (
    SELECT count(pg_notify(%(channel)s, %(lane)s)) AS lanes
    FROM (SELECT 1 FROM retried LIMIT 1) AS any_retried
)
SELECT retried.* FROM retried, notified
