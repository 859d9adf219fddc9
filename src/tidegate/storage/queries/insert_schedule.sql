-- Create a schedule (schedules_name_unique: a name is taken once per project) of a
-- project that exists, or of the library's own project (%(default_project)s, which has
-- no row): for any other project no row is inserted, none comes back, and the caller
-- answers that there is no such project.
INSERT INTO schedules (project, name, task, args, lane, key, priority, max_attempts, cron,
                       interval_seconds, timezone, catch_up, catch_up_limit, overlap, paused,
                       next_tick)
SELECT %(project)s, %(name)s, %(task)s, %(args)s::jsonb, %(lane)s, %(key)s,
       %(priority)s::smallint, %(max_attempts)s::smallint, %(cron)s,
       %(interval_seconds)s::float8, %(timezone)s, %(catch_up)s,
       %(catch_up_limit)s::integer, %(overlap)s, %(paused)s::boolean, %(next_tick)s::timestamptz
WHERE %(project)s::text = %(default_project)s::text
   OR EXISTS (SELECT FROM projects WHERE id = %(project)s)
RETURNING id
