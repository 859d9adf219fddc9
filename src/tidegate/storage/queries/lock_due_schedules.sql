-- Lock the schedules whose next tick has come, of tasks this worker has (it resolves
-- their runs as its app would enqueue them), soonest first (schedules_due).
-- SKIP LOCKED: every worker runs this each second; a schedule another worker holds is
-- its to fire. A row another worker moved on meanwhile is read again under the lock and
-- no longer matches (next_tick > now()), so a tick is fired once.
-- now: the database's clock, the one next_tick is compared with.
SELECT id, project, name, task, args, lane, key, priority, max_attempts, cron,
       interval_seconds, timezone, catch_up, catch_up_limit, next_tick, now() AS now
FROM schedules
WHERE NOT paused AND next_tick <= now() AND task = ANY(%(tasks)s::text[])
ORDER BY next_tick
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
