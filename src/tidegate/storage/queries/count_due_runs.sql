-- How many runs of these tasks a worker could still start now, or is running: ready,
-- waiting for a worker (pending), running, or scheduled and due, outside the paused
-- lanes. tidegate.testing's drain works until none is left; a run scheduled for later
-- (a retry's backoff, a delay) is not due, and one of a paused lane is not claimed. For
-- a test's own schema: it reads the table without an index of its own.
SELECT count(*) FROM runs
WHERE task = ANY(%(tasks)s::text[])
  AND (state = 'running'
       OR (lane <> ALL(ARRAY(SELECT lane FROM paused_lanes))
           AND (state IN ('available', 'pending')
                OR (state = 'scheduled' AND scheduled_at <= now()))))
