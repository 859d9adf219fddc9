-- Outcomes complete_runs did not record, because their runs had left this worker (lease
-- lapsed, cancelled, or a claim lost in a database crash): an entry in each run's
-- errors, so that an execution the run's state does not show is in its history.
UPDATE runs
SET errors = runs.errors || jsonb_build_array(jsonb_build_object(
    'attempt', late.attempt,
    'at', now(),
    'error', format(
        'late outcome: attempt %%s ended (%%s) on worker %%s after the run had left it'
        ' (its lease lapsed, it was cancelled, or a database crash lost the claim);'
        ' not recorded', late.attempt, late.state, %(worker_id)s::text)))
FROM jsonb_to_recordset(%(outcomes)s::jsonb) AS late(id bigint, attempt smallint, state text)
WHERE runs.id = late.id
RETURNING runs.id
