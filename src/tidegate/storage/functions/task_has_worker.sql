-- Whether a live worker has the task and a workloop whose chain takes the lane: else
-- nothing can run it, and it waits in 'pending' (out of the claim's indexes) until a
-- worker that has the task starts and stages it back (stage_runs.sql). Workers are few:
-- a scan of their rows is cheap. Asked by the keyed claim and the parker (park_strays),
-- once per (lane, task) they meet, and by find_task_workers.sql.
CREATE OR REPLACE FUNCTION task_has_worker(p_lane text, p_task text, p_live_seconds float8)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM workers w
        CROSS JOIN LATERAL jsonb_array_elements(w.workloops) AS l(loop)
        WHERE w.heartbeat_at > now() - make_interval(secs => p_live_seconds)
          AND p_task = ANY(w.tasks)
          AND (l.loop -> 'chain' ? p_lane OR l.loop -> 'chain' ? '*')
    );
END
$$;
