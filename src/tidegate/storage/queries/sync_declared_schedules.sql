-- At a worker's start, write the schedules its app declares in code (@app.periodic) and
-- delete the declared schedules of its tasks that the code no longer declares.
-- A declared schedule keeps its next tick while its timing (cron, interval, time zone)
-- is unchanged, and its pause always: several workers starting at once write the same
-- rows and fire nothing twice. A name an admin took for a schedule of their own stays
-- theirs (WHERE schedules.declared): it is not among the rows returned.
WITH declared AS (
    SELECT * FROM jsonb_to_recordset(%(schedules)s::jsonb) AS (
        project text, name text, task text, args jsonb, lane text, key text,
        priority smallint, max_attempts smallint, cron text, interval_seconds float8,
        timezone text, catch_up text, catch_up_limit integer, overlap text,
        next_tick timestamptz
    )
),
gone AS (
    DELETE FROM schedules s
    WHERE s.declared AND s.task = ANY(%(tasks)s::text[])
      AND NOT EXISTS (SELECT FROM declared d WHERE d.project = s.project AND d.name = s.name)
    RETURNING s.project, s.name
),
written AS (
    INSERT INTO schedules AS s (project, name, task, args, lane, key, priority, max_attempts,
                                cron, interval_seconds, timezone, catch_up, catch_up_limit,
                                overlap, declared, next_tick)
    SELECT project, name, task, args, lane, key, priority, max_attempts, cron,
           interval_seconds, timezone, catch_up, catch_up_limit, overlap, true, next_tick
    FROM declared
    ON CONFLICT ON CONSTRAINT schedules_name_unique DO UPDATE
    SET task = excluded.task, args = excluded.args, lane = excluded.lane,
        key = excluded.key, priority = excluded.priority,
        max_attempts = excluded.max_attempts, cron = excluded.cron,
        interval_seconds = excluded.interval_seconds, timezone = excluded.timezone,
        catch_up = excluded.catch_up, catch_up_limit = excluded.catch_up_limit,
        overlap = excluded.overlap,
        next_tick = CASE
            WHEN (s.cron, s.interval_seconds, s.timezone)
                 IS NOT DISTINCT FROM (excluded.cron, excluded.interval_seconds, excluded.timezone)
            THEN s.next_tick ELSE excluded.next_tick END,
        updated_at = now()
    WHERE s.declared
    RETURNING s.project, s.name
)
SELECT 'written' AS change, project, name FROM written
UNION ALL
SELECT 'deleted', project, name FROM gone
