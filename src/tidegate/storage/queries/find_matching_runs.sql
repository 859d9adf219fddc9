-- A batch of a bulk retry or cancel: the ids of the runs that match the run list's
-- filters and are in one of %(states)s (those the action can change), newest first
-- below the keyset %(before)s. Read without a lock: the action's own statement
-- (retry_run, cancel_run) locks each run only while it changes it, and passes over one
-- that has left those states meanwhile. The primary key, read backward, bounds a batch
-- to the rows up to its last match.
SELECT id FROM runs
WHERE state = ANY(%(states)s::run_state[])
  AND (%(state)s::run_state IS NULL OR state = %(state)s::run_state)
  AND (%(project)s::text IS NULL OR project = %(project)s)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(key)s::text IS NULL OR key = %(key)s)
  AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s::integer
