-- Make scheduled runs that have come due available (runs_due), and wake their lanes.
-- They are stamped again on their key's clock (see insert_runs): a run that waited for
-- its time, or for a retry, joins the line where its key stands now.
-- SKIP LOCKED lets every worker's stager run without waiting on the others.
WITH due AS (
    SELECT id, lane, key FROM runs
    WHERE state = 'scheduled' AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
clock AS MATERIALIZED (  -- once per key, not per run
    SELECT lane, key, key_clock(lane, key) AS start, key_weight(lane, key) AS weight
    FROM (SELECT DISTINCT lane, key FROM due) AS keys
),
stamped AS (
    SELECT due.id,
           clock.start + row_number() OVER (PARTITION BY due.lane, due.key ORDER BY due.id)
                         / clock.weight AS vtime
    FROM due JOIN clock ON clock.lane = due.lane AND clock.key = due.key
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
