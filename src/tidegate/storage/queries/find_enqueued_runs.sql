-- The runs not started yet (scheduled, available, pending), oldest first: of a task, and
-- whose args contain the given ones (jsonb @>), each NULL matching any. What
-- tidegate.testing's assert_enqueued looks for, in a test's own schema: no index serves
-- it, and none is worth its cost on every enqueue.
SELECT * FROM runs
WHERE state IN ('scheduled', 'available', 'pending')
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
ORDER BY id
