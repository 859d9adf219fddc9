-- A worker's heartbeat: its row (workloops, slots, busy, the tasks it has) for the
-- cluster's capacity view and for claims of runs it could take, the leases of the
-- runs it holds, extended, and the attempts it finished since its last heartbeat,
-- added to its counters and to this minute's counts of the dashboard's charts: all in
-- the same round trip. A remote worker (token: its worker token's name) beats through
-- the API (api/workers.py); what it holds and no longer has (cancelled, rescued)
-- is what it sent and is not among the renewed.
-- The heartbeat and the leases are stamped with the time of the write, not the
-- transaction's start: a beat that waited for a lock (a table locked for seconds) would
-- otherwise write a lease that had already run out, and its runs would be rescued while
-- their handlers execute.
WITH beat AS (
    INSERT INTO workers (id, host, pid, workloops, tasks, token, heartbeat_at)
    VALUES (%(worker_id)s, %(host)s, %(pid)s, %(workloops)s::jsonb, %(tasks)s::text[],
            %(token)s, clock_timestamp())
    ON CONFLICT (id) DO UPDATE
    SET workloops = excluded.workloops, tasks = excluded.tasks, heartbeat_at = clock_timestamp()
),
renewed AS (
    UPDATE runs
    SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s::float8)
    WHERE id = ANY(%(run_ids)s::bigint[]) AND state = 'running' AND worker_id = %(worker_id)s
    RETURNING id
),
-- Only this worker writes these rows, but a fold may have taken them meanwhile: then
-- the counts start new rows, and nothing is counted twice.
counted AS (
    INSERT INTO worker_counters AS c (worker_id, task, lane, outcome, attempts, seconds, buckets)
    SELECT %(worker_id)s, n.task, n.lane, n.outcome, n.attempts, n.seconds, n.buckets
    FROM jsonb_to_recordset(%(counters)s::jsonb) AS n(
        task text, lane text, outcome text, attempts bigint, seconds float8, buckets bigint[]
    )
    ORDER BY n.task, n.lane, n.outcome
    ON CONFLICT (worker_id, task, lane, outcome) DO UPDATE
    SET attempts = c.attempts + excluded.attempts,
        seconds = c.seconds + excluded.seconds,
        buckets = add_buckets(c.buckets, excluded.buckets)
),
-- Other workers add to the same rows: the same order everywhere, so none deadlock.
minutes AS (
    INSERT INTO minute_counts AS m (minute, source, project, lane, task, outcome, count)
    SELECT date_trunc('minute', now()), 'attempt', '', n.lane, n.task, n.outcome,
           sum(n.attempts)
    FROM jsonb_to_recordset(%(counters)s::jsonb) AS n(
        task text, lane text, outcome text, attempts bigint
    )
    WHERE n.outcome <> 'claimed'
    GROUP BY n.lane, n.task, n.outcome
    ORDER BY n.lane, n.task, n.outcome
    ON CONFLICT (minute, source, project, lane, task, outcome) DO UPDATE
    SET count = m.count + excluded.count
)
-- A heartbeat commits without waiting for the WAL flush: a crash may lose the last
-- one, whose leases the one before still covers for most of a lease.
SELECT coalesce(array_agg(id), '{}') AS renewed,
       set_config('synchronous_commit', 'off', true) AS commit_mode
FROM renewed
