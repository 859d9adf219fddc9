-- The runs that hold these idempotency keys in a project (runs_idempotency).
SELECT * FROM runs
WHERE project = %(project)s AND idempotency_key = ANY(%(keys)s::text[])
