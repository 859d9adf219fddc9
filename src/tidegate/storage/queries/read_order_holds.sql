-- The line of each ordered key among the given (lane, key) pairs (its own policy's
-- `ordered`, else its lane's default's; never in fast_lane, which the order exempts): the
-- run at its front, the one its other runs wait behind (functions/line_front.sql), with
-- that run's state and when it is due. A pair whose key is not ordered is left out. Two
-- primary-key probes of key_policies and two index probes per pair.
SELECT wanted.lane, wanted.key, front.id, front.state::text, front.scheduled_at
FROM unnest(%(lanes)s::text[], %(keys)s::text[]) AS wanted(lane, key)
LEFT JOIN key_policies AS own ON own.lane = wanted.lane AND own.key = wanted.key
LEFT JOIN key_policies AS lane_default
    ON lane_default.lane = wanted.lane AND lane_default.key = '*'
CROSS JOIN LATERAL line_front(wanted.lane, wanted.key) AS front
WHERE wanted.lane <> 'fast_lane' AND coalesce(own.ordered, lane_default.ordered, false)
