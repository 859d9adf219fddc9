-- The workers page: the runs each of the given workers runs now (its last claimer's id
-- is on the run), the longest running first, at most per_worker each. Runs in flight are
-- a few per worker slot, all in runs_held (and runs_running): the scan is bounded by the
-- cluster's slots, not by the table.
SELECT worker_id, id, task, key, lane, attempted_at
FROM (
    SELECT worker_id, id, task, key, lane, attempted_at,
           row_number() OVER (PARTITION BY worker_id ORDER BY attempted_at, id) AS place
    FROM runs
    WHERE state = 'running' AND worker_id = ANY (%(workers)s::text[])
) AS running
WHERE place <= %(per_worker)s::integer
ORDER BY worker_id, attempted_at, id
