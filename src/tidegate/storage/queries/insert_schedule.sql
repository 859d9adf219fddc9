-- Create a schedule (schedules_name_unique: a name is taken once per project).
INSERT INTO schedules (project, name, task, args, lane, key, priority, max_attempts, cron,
                       interval_seconds, timezone, catch_up, catch_up_limit, overlap, paused,
                       next_tick)
VALUES (%(project)s, %(name)s, %(task)s, %(args)s::jsonb, %(lane)s, %(key)s,
        %(priority)s::smallint, %(max_attempts)s::smallint, %(cron)s,
        %(interval_seconds)s::float8, %(timezone)s, %(catch_up)s,
        %(catch_up_limit)s::integer, %(overlap)s, %(paused)s::boolean, %(next_tick)s::timestamptz)
RETURNING id
