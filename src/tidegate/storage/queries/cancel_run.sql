-- Cancel the runs of %(ids)s that have not finished (one, or a bulk cancel's batch). A running attempt's worker finds at its next
-- heartbeat that the lease was not renewed and cancels an async handler; a completion
-- that comes anyway finds the run no longer running and writes nothing, so the cancel
-- is the run's final transition: a fast-lane run, or a watched one, NOTIFYs its id here,
-- for the caller waiting on it, as a completion would.
WITH cancelled AS (
    UPDATE runs
    SET state = 'cancelled', completed_at = now(), lease_expires_at = NULL
    WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('scheduled', 'available', 'pending', 'running')
    RETURNING *
),
notified AS (
    SELECT count(pg_notify(%(completed_channel)s, id::text)) AS runs
    FROM cancelled WHERE lane = 'fast_lane' OR watched
)
SELECT cancelled.* FROM cancelled, notified
