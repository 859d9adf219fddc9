-- Record the outcomes of a batch of attempts, and their progress events, in one
-- statement (functions/complete_runs.sql): each a JSON array of objects.
SELECT * FROM complete_runs(
    %(worker_id)s::text, %(completed_channel)s::text, %(channel)s::text,
    %(outcomes)s::jsonb, %(events)s::jsonb
)
