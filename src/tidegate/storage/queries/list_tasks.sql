-- The declared tasks in name order, a page at a time: after %(after)s, the last name of
-- the page before (tasks_pkey).
SELECT name, lane, max_attempts, timeout_seconds, priority, key_function, declared_by,
       updated_at
FROM tasks
WHERE %(after)s::text IS NULL OR name > %(after)s::text
ORDER BY name
LIMIT %(limit)s
