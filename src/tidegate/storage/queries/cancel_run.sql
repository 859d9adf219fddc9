-- Cancel a run that has not finished. A running attempt is not interrupted; its
-- completion then finds the run no longer running and writes nothing.
UPDATE runs
SET state = 'cancelled', completed_at = now(), lease_expires_at = NULL
WHERE id = %(id)s AND state IN ('scheduled', 'available', 'running')
RETURNING *
