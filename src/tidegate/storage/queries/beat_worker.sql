-- A worker's heartbeat: its row (workloops, slots, busy) for the cluster's capacity
-- view, and the leases of the runs it holds, extended in the same round trip.
WITH beat AS (
    INSERT INTO workers (id, host, pid, workloops)
    VALUES (%(worker_id)s, %(host)s, %(pid)s, %(workloops)s::jsonb)
    ON CONFLICT (id) DO UPDATE
    SET workloops = excluded.workloops, heartbeat_at = now()
),
renewed AS (
    UPDATE runs
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s::float8)
    WHERE id = ANY(%(run_ids)s::bigint[]) AND state = 'running' AND worker_id = %(worker_id)s
    RETURNING id
)
SELECT count(*) AS renewed FROM renewed
