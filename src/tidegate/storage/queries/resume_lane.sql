-- Resume a lane, and wake the workers that take it as an enqueue does (a NOTIFY on
-- %(channel)s naming the lane, sent at commit): a hint, their polls cover a lost one.
-- Returns the lane if it was paused, nothing if it was not.
WITH resumed AS (
    DELETE FROM paused_lanes WHERE lane = %(lane)s RETURNING lane
)
SELECT resumed.lane, pg_notify(%(channel)s, resumed.lane) FROM resumed
