-- Change a schedule: every field is given (the caller merged its changes into the row
-- it read); next_tick is the caller's too, moved when the timing changed or it resumed.
UPDATE schedules
SET task = %(task)s, args = %(args)s::jsonb, lane = %(lane)s, key = %(key)s,
    priority = %(priority)s::smallint, max_attempts = %(max_attempts)s::smallint,
    cron = %(cron)s, interval_seconds = %(interval_seconds)s::float8,
    timezone = %(timezone)s, catch_up = %(catch_up)s,
    catch_up_limit = %(catch_up_limit)s::integer, overlap = %(overlap)s,
    paused = %(paused)s::boolean,
    next_tick = %(next_tick)s::timestamptz, updated_at = now()
WHERE project = %(project)s AND name = %(name)s
RETURNING id
