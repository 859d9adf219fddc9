-- Make scheduled runs that have come due available (runs_due), and wake their lanes.
-- SKIP LOCKED lets every worker's stager run without waiting on the others.
WITH due AS (
    SELECT id FROM runs
    WHERE state = 'scheduled' AND scheduled_at <= now()
    ORDER BY scheduled_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
staged AS (
    UPDATE runs SET state = 'available'
    FROM due WHERE runs.id = due.id
    RETURNING runs.lane
),
notified AS (
    SELECT count(pg_notify(%(channel)s, lane)) AS lanes
    FROM (SELECT DISTINCT lane FROM staged) AS ready
)
SELECT (SELECT count(*) FROM staged) AS staged FROM notified
