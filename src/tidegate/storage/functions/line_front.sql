-- The front of an ordered key's line (tidegate.policies, `ordered`): its run in flight
-- (runs_running), else its earliest run not started (runs_key_line, by id), as the claim
-- reads them (claim_runs_keyed.sql); no row when the key has neither. Two index probes.
-- A single SELECT in SQL, so a caller's LATERAL inlines it and plans it with the caller.
CREATE OR REPLACE FUNCTION line_front(p_lane text, p_key text)
RETURNS TABLE (id bigint, state run_state, scheduled_at timestamptz, project text)
LANGUAGE sql STABLE AS $$
    SELECT line.id, line.state, line.scheduled_at, line.project FROM (
        (SELECT runs.id, runs.state, runs.scheduled_at, runs.project, 0 AS place FROM runs
         WHERE runs.lane = p_lane AND runs.key = p_key AND runs.state = 'running'
         ORDER BY runs.id LIMIT 1)
        UNION ALL
        (SELECT runs.id, runs.state, runs.scheduled_at, runs.project, 1 AS place FROM runs
         WHERE runs.lane = p_lane AND runs.key = p_key AND runs.in_line
           AND runs.state IN ('scheduled', 'available', 'pending')
         ORDER BY runs.id LIMIT 1)
    ) AS line
    ORDER BY line.place
    LIMIT 1
$$;
