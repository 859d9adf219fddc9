-- A worker's heartbeat: its row (workloops, slots, busy, the tasks it has) for the
-- cluster's capacity view and for claims of runs it could take, and the leases of the
-- runs it holds, extended in the same round trip.
WITH beat AS (
    INSERT INTO workers (id, host, pid, workloops, tasks)
    VALUES (%(worker_id)s, %(host)s, %(pid)s, %(workloops)s::jsonb, %(tasks)s::text[])
    ON CONFLICT (id) DO UPDATE
    SET workloops = excluded.workloops, tasks = excluded.tasks, heartbeat_at = now()
),
renewed AS (
    UPDATE runs
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8)
    WHERE id = ANY(%(run_ids)s::bigint[]) AND state = 'running' AND worker_id = %(worker_id)s
    RETURNING id
)
SELECT count(*) AS renewed FROM renewed
