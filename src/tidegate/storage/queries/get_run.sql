-- One run, and whether its lane is paused (Run.reason): a probe of paused_lanes' key.
SELECT runs.*,
       EXISTS (SELECT 1 FROM paused_lanes WHERE paused_lanes.lane = runs.lane) AS lane_paused
FROM runs WHERE id = %(id)s
