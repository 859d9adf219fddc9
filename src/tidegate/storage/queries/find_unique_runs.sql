-- The runs that hold these unique keys (runs_unique: the predicate is the index's own).
SELECT * FROM runs
WHERE unique_key = ANY(%(keys)s::text[]) AND unique_key IS NOT NULL AND state = ANY (unique_states)
