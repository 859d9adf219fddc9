-- Which of these runs have finished (the progress of tidegate demo): one probe of
-- runs_pkey per id, so the cost follows the runs still awaited, not the table.
SELECT id FROM runs
WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('succeeded', 'discarded', 'cancelled')
