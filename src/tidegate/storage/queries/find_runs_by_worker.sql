-- The runs a worker claimed last (a run keeps its last claimer's id), in id order:
-- what tidegate.testing's drain worked, as they stand after it. For a test's own
-- schema: it reads the table without an index of its own.
SELECT * FROM runs WHERE worker_id = %(worker_id)s ORDER BY id
