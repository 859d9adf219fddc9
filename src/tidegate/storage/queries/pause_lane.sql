-- Pause a lane: from this statement's commit on, no claim takes its runs (claim_runs.sql,
-- claim_runs_keyed) and its sync webhooks are refused (admit_webhook). Pausing a paused
-- lane keeps the time it has been paused since, and takes the new surface and reason.
-- At most %(max_paused)s lanes are paused at once: every claim reads them all.
INSERT INTO paused_lanes AS p (lane, paused_by, reason)
SELECT %(lane)s::text, %(by)s::text, %(reason)s::text
WHERE (SELECT count(*) FROM paused_lanes WHERE paused_lanes.lane <> %(lane)s) < %(max_paused)s
ON CONFLICT (lane) DO UPDATE SET paused_by = excluded.paused_by, reason = excluded.reason
RETURNING p.lane, p.paused_at, p.paused_by, p.reason
