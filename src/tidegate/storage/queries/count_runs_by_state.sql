-- The run list's state tabs: how many runs of each state match the list's other
-- filters, counted up to %(cap)s each (the page shows the cap as "cap+"), so that a tab
-- costs at most that many rows however large the table. One part per state, each with
-- its state as a constant: the planner can then read the state's own partial index
-- (runs_due, runs_claim_lane, runs_pending, runs_running, runs_failed, runs_finished)
-- or the project's (runs_project), whichever the filters make cheaper.
SELECT 'scheduled'::run_state AS state, count(*) AS runs FROM (
    SELECT 1 FROM runs
     WHERE state = 'scheduled'
       AND (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
     LIMIT %(cap)s::integer) AS capped
UNION ALL
SELECT 'available'::run_state AS state, count(*) AS runs FROM (
    SELECT 1 FROM runs
     WHERE state = 'available'
       AND (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
     LIMIT %(cap)s::integer) AS capped
UNION ALL
SELECT 'pending'::run_state AS state, count(*) AS runs FROM (
    SELECT 1 FROM runs
     WHERE state = 'pending'
       AND (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
     LIMIT %(cap)s::integer) AS capped
UNION ALL
SELECT 'running'::run_state AS state, count(*) AS runs FROM (
    SELECT 1 FROM runs
     WHERE state = 'running'
       AND (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
     LIMIT %(cap)s::integer) AS capped
UNION ALL
SELECT 'succeeded'::run_state AS state, count(*) AS runs FROM (
    SELECT 1 FROM runs
     WHERE state = 'succeeded'
       AND (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
     LIMIT %(cap)s::integer) AS capped
UNION ALL
SELECT 'discarded'::run_state AS state, count(*) AS runs FROM (
    SELECT 1 FROM runs
     WHERE state = 'discarded'
       AND (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
     LIMIT %(cap)s::integer) AS capped
UNION ALL
SELECT 'cancelled'::run_state AS state, count(*) AS runs FROM (
    SELECT 1 FROM runs
     WHERE state = 'cancelled'
       AND (%(project)s::text IS NULL OR project = %(project)s)
       AND (%(lane)s::text IS NULL OR lane = %(lane)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       AND (%(key)s::text IS NULL OR key = %(key)s)
       AND (%(args)s::jsonb IS NULL OR args @> %(args)s::jsonb)
     LIMIT %(cap)s::integer) AS capped
