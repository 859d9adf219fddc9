-- A worker that stops cleanly folds its counters, with the attempts it finished since
-- its last heartbeat, into the rows of worker_id 'retired', in one statement: the
-- cluster's sums never go back, and its rows are gone.
WITH mine AS (
    DELETE FROM worker_counters WHERE worker_id = %(worker_id)s
    RETURNING task, lane, outcome, attempts, seconds, buckets
),
last AS (
    SELECT n.task, n.lane, n.outcome, n.attempts, n.seconds, n.buckets
    FROM jsonb_to_recordset(%(counters)s::jsonb) AS n(
        task text, lane text, outcome text, attempts bigint, seconds float8, buckets bigint[]
    )
)
INSERT INTO worker_counters AS c (worker_id, task, lane, outcome, attempts, seconds, buckets)
SELECT 'retired', task, lane, outcome, sum(attempts), sum(seconds), sum_buckets(buckets)
FROM (SELECT * FROM mine UNION ALL SELECT * FROM last) AS counted
GROUP BY task, lane, outcome
-- The same order in every fold, so that two folds lock the retired rows alike.
ORDER BY task, lane, outcome
ON CONFLICT (worker_id, task, lane, outcome) DO UPDATE
SET attempts = c.attempts + excluded.attempts,
    seconds = c.seconds + excluded.seconds,
    buckets = add_buckets(c.buckets, excluded.buckets)
