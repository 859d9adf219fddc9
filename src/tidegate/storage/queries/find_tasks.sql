-- The declared settings of the tasks an enqueue names by name only (tasks_pkey, one
-- probe each): the process enqueueing does not have their code, the workers that do
-- declared them (declare_tasks.sql).
SELECT name, lane, max_attempts, timeout_seconds, priority, key_function, declared_by,
       updated_at
FROM tasks
WHERE name = ANY(%(names)s::text[])
