-- Newest first; every filter is optional (NULL matches all); a page starts after the
-- keyset %(before)s (the last id of the page before). Runs in flight come from
-- runs_running (at most the workers' slots), ready runs from the claim's indexes, the
-- others through the index their filter needs (runs_project holds neither: see
-- schema.sql); each part is read only where the state filter lets it have rows. The args
-- filter (containment, @>) has no index of its own: it sifts the rows the other filters'
-- index reads, newest first, until the page is full.
SELECT * FROM (
    (SELECT * FROM runs
     WHERE (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(state)s::run_state IS NULL OR state = %(state)s::run_state)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
       AND state NOT IN ('available', 'running')
       AND coalesce(%(state)s::run_state NOT IN ('available', 'running'), true)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
     ORDER BY id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM runs
     WHERE (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
       AND state = 'running' AND coalesce(%(state)s::run_state = 'running', true)
     ORDER BY id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT * FROM runs
     WHERE (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
       AND (%(before)s::bigint IS NULL OR id < %(before)s)
       AND state = 'available' AND coalesce(%(state)s::run_state = 'available', true)
     ORDER BY id DESC
     LIMIT %(limit)s)
) AS found
ORDER BY id DESC
LIMIT %(limit)s
