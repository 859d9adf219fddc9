-- A page of the dashboard's run list: newest first, every filter optional (NULL
-- matches all), after the keyset %(before)s (the last id of the page before). The
-- columns of a list only: args and result may be large, the run's page shows them.
-- Runs in flight come from runs_running or runs_held (at most the workers' slots), ready
-- runs from the claim's indexes, the others through the index their filter needs
-- (runs_project holds neither: see schema.sql); each part is read only where the state
-- filter lets it have rows. Which index serves each filter, and what a page costs at 1,000,000 runs:
-- docs/dashboard.md. The args filter (containment, @>) has no index of its own: it sifts
-- the rows the other filters' index reads, newest first, until the page is full.
SELECT * FROM (
    (SELECT id, state, task, lane, key, project, attempt, max_attempts,
            inserted_at, scheduled_at, attempted_at, completed_at
     FROM runs
     WHERE (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(state)s::run_state IS NULL OR state = %(state)s::run_state)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
       AND state NOT IN ('available', 'running')
       AND coalesce(%(state)s::run_state NOT IN ('available', 'running'), true)
     ORDER BY id DESC
     LIMIT %(limit)s::integer)
    UNION ALL
    (SELECT id, state, task, lane, key, project, attempt, max_attempts,
            inserted_at, scheduled_at, attempted_at, completed_at
     FROM runs
     WHERE (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
       AND state = 'running' AND coalesce(%(state)s::run_state = 'running', true)
     ORDER BY id DESC
     LIMIT %(limit)s::integer)
    UNION ALL
    (SELECT id, state, task, lane, key, project, attempt, max_attempts,
            inserted_at, scheduled_at, attempted_at, completed_at
     FROM runs
     WHERE (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
       AND state = 'available' AND coalesce(%(state)s::run_state = 'available', true)
     ORDER BY id DESC
     LIMIT %(limit)s::integer)
) AS page
ORDER BY id DESC
LIMIT %(limit)s::integer
