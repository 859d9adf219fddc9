-- The line of each ordered key among the given (lane, key) pairs (its own policy's
-- `ordered`, else its lane's default's; never in fast_lane, which the order exempts): the
-- run at its front, the one its other runs wait behind: its run in flight (runs_running),
-- else its earliest run not started (runs_key_line, by id), as the claim reads them; with
-- that run's state and when it is due. A pair whose key is not ordered is left out. Two
-- primary-key probes of key_policies and two index probes per pair.
SELECT wanted.lane, wanted.key, front.id, front.state::text, front.scheduled_at
FROM unnest(%(lanes)s::text[], %(keys)s::text[]) AS wanted(lane, key)
LEFT JOIN key_policies AS own ON own.lane = wanted.lane AND own.key = wanted.key
LEFT JOIN key_policies AS lane_default
    ON lane_default.lane = wanted.lane AND lane_default.key = '*'
CROSS JOIN LATERAL (
    SELECT line.id, line.state, line.scheduled_at FROM (
        (SELECT runs.id, runs.state, runs.scheduled_at, 0 AS place FROM runs
         WHERE runs.lane = wanted.lane AND runs.key = wanted.key AND runs.state = 'running'
         ORDER BY runs.id LIMIT 1)
        UNION ALL
        (SELECT runs.id, runs.state, runs.scheduled_at, 1 AS place FROM runs
         WHERE runs.lane = wanted.lane AND runs.key = wanted.key AND runs.in_line
           AND runs.state IN ('scheduled', 'available', 'pending')
         ORDER BY runs.id LIMIT 1)
    ) AS line
    ORDER BY line.place
    LIMIT 1
) AS front
WHERE wanted.lane <> 'fast_lane' AND coalesce(own.ordered, lane_default.ordered, false)
