-- How many runs of these tasks a worker could still start now, or is running: ready,
-- waiting for a worker (pending), running, or scheduled and due. tidegate.testing's
-- drain works until none is left; a run scheduled for later (a retry's backoff, a
-- delay) is not due. For a test's own schema: it reads the table without an index of
-- its own.
SELECT count(*) FROM runs
WHERE task = ANY(%(tasks)s::text[])
  AND (state IN ('available', 'pending', 'running')
       OR (state = 'scheduled' AND scheduled_at <= now()))
