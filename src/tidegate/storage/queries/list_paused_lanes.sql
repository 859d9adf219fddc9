-- The paused lanes, by name (at most pause_lane.sql's bound of them).
SELECT lane, paused_at, paused_by, reason FROM paused_lanes ORDER BY lane
