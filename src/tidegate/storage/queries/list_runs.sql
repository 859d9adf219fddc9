-- Newest first; every filter is optional (NULL matches all).
SELECT * FROM runs
WHERE (%(project)s::text IS NULL OR project = %(project)s)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s)
  AND (%(state)s::run_state IS NULL OR state = %(state)s::run_state)
  AND (%(task)s::text IS NULL OR task = %(task)s)
ORDER BY id DESC
LIMIT %(limit)s
