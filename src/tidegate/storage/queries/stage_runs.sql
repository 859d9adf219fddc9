-- Make ready the runs this worker can start now, and wake their lanes:
--   due: scheduled runs that have come due (runs_due);
--   wanted: pending runs of tasks this worker has, in lanes its workloops take
--     (runs_pending): they waited for a worker like this one.
-- They are stamped again on their key's clock (see insert_runs): a run that waited for
-- its time, a retry, or a worker, joins the line where its key stands now.
-- SKIP LOCKED lets every worker's stager run without waiting on the others.
WITH due AS (
    SELECT id, lane, key FROM runs
    WHERE state = 'scheduled' AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
wanted AS (
    SELECT id, lane, key FROM runs
    WHERE state = 'pending' AND task = ANY(%(tasks)s::text[])
      AND (%(wildcard)s::boolean OR lane = ANY(%(lanes)s::text[]))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
ready AS (
    SELECT * FROM due UNION ALL SELECT * FROM wanted
),
clock AS MATERIALIZED (  -- once per key, not per run
    SELECT lane, key, key_clock(lane, key) AS start, key_weight(lane, key) AS weight
    FROM (SELECT DISTINCT lane, key FROM ready) AS keys
),
stamped AS (
    SELECT ready.id,
           clock.start + row_number() OVER (PARTITION BY ready.lane, ready.key ORDER BY ready.id)
                         / clock.weight AS vtime
    FROM ready JOIN clock ON clock.lane = ready.lane AND clock.key = ready.key
),
staged AS (
    UPDATE runs SET state = 'available', vtime = stamped.vtime
    FROM stamped WHERE runs.id = stamped.id
    RETURNING runs.lane
),
notified AS (
    SELECT count(pg_notify(%(channel)s, lane)) AS lanes
    FROM (SELECT DISTINCT lane FROM staged) AS ready
)
SELECT (SELECT count(*) FROM staged) AS staged FROM notified
