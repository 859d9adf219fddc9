-- Schedules (of a project, or of all), with their last run's state (runs_pkey; NULL
-- once pruned), in project and name order, a page at a time: after the keyset
-- (%(after_project)s, %(after_name)s), the last schedule of the page before.
SELECT s.id, s.project, s.name, s.task, s.args, s.lane, s.key, s.priority, s.max_attempts,
       s.cron, s.interval_seconds, s.timezone, s.catch_up, s.catch_up_limit, s.overlap, s.declared,
       s.paused, s.next_tick, s.last_tick, s.last_run_id, r.state::text AS last_run_state,
       s.missed_ticks, s.last_error, s.created_at, s.updated_at
FROM schedules s
LEFT JOIN runs r ON r.id = s.last_run_id
WHERE (%(project)s::text IS NULL OR s.project = %(project)s)
  AND (%(name)s::text IS NULL OR s.name = %(name)s)
  AND (%(after_project)s::text IS NULL
       OR (s.project, s.name) > (%(after_project)s::text, %(after_name)s::text))
ORDER BY s.project, s.name
LIMIT %(limit)s
