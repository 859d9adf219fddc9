-- Lock the schedules whose next tick has come, of tasks this worker has (it resolves
-- their runs as its app would enqueue them), soonest first (schedules_due).
-- SKIP LOCKED: every worker runs this each second; a schedule another worker holds is
-- its to fire. A row another worker moved on meanwhile is read again under the lock and
-- no longer matches (next_tick > now()), so a tick is fired once.
-- last_run_active: whether its last run has yet to finish (the overlap policy), read by
-- primary key and not locked.
-- now: the database's clock, the one next_tick is compared with.
SELECT s.id, s.project, s.name, s.task, s.args, s.lane, s.key, s.priority, s.max_attempts,
       s.cron, s.interval_seconds, s.timezone, s.catch_up, s.catch_up_limit, s.overlap,
       s.next_tick, r.state IN ('scheduled', 'available', 'pending', 'running')
                    IS TRUE AS last_run_active,
       now() AS now
FROM schedules s
LEFT JOIN runs r ON r.id = s.last_run_id
WHERE NOT s.paused AND s.next_tick <= now() AND s.task = ANY(%(tasks)s::text[])
ORDER BY s.next_tick
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED
