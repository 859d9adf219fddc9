-- Delete a worker token and the rows of the workers that registered with it: their
-- capacity is gone at once, and the runs they hold are rescued when their leases lapse.
WITH gone AS (
    DELETE FROM worker_tokens WHERE name = %(name)s RETURNING name
),
workers_gone AS (
    DELETE FROM workers WHERE token IN (SELECT name FROM gone)
)
SELECT name FROM gone
