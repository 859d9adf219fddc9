-- For each (lane, task): whether a live worker has the task and a workloop for the lane
-- (functions/task_has_worker.sql). A lane given as NULL is the task's declared one
-- (tidegate.tasks; tasks_pkey), else 'default': where an async trigger's runs go.
SELECT route.lane, route.task, task_has_worker(route.lane, route.task, %(live_seconds)s::float8)
FROM unnest(%(lanes)s::text[], %(tasks)s::text[]) AS given(lane, task)
CROSS JOIN LATERAL (
    SELECT coalesce(given.lane, (SELECT t.lane FROM tasks t WHERE t.name = given.task),
                    'default') AS lane,
           given.task
) AS route
