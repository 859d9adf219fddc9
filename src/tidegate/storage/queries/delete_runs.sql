-- Delete the finished runs of %(ids)s (a batch of a bulk delete: tidegate.runs.bulk_runs)
-- with their progress events, as the pruner does when their retention ends; a run that
-- left its finished state meanwhile (retried) is left. A run's webhook request keeps its
-- own retention: the webhook log then shows the request without its run.
WITH gone AS (
    DELETE FROM runs
    WHERE id = ANY(%(ids)s::bigint[]) AND state = ANY(%(states)s::run_state[])
    RETURNING id
),
gone_events AS (  -- runs at once, as every data-modifying CTE does
    DELETE FROM run_events USING gone WHERE run_events.run_id = gone.id
)
SELECT id FROM gone
