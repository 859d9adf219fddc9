-- Move fired schedules past now, in the transaction that inserted their runs (and
-- holds their rows: lock_due_schedules). A schedule whose tick failed (error) keeps its
-- last run and says why.
WITH fired AS (
    SELECT * FROM jsonb_to_recordset(%(fired)s::jsonb) AS (
        id bigint, next_tick timestamptz, last_tick timestamptz, last_run_id bigint,
        missed bigint, error text
    )
)
UPDATE schedules s
SET next_tick = f.next_tick,
    last_tick = coalesce(f.last_tick, s.last_tick),
    last_run_id = coalesce(f.last_run_id, s.last_run_id),
    missed_ticks = s.missed_ticks + f.missed,
    last_error = f.error,
    updated_at = now()
FROM fired f
WHERE s.id = f.id
RETURNING s.id
