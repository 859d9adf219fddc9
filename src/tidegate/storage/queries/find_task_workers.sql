-- For each (lane, task): whether a live worker has the task and a workloop for the lane
-- (functions/task_has_worker.sql). A lane given as NULL is the task's declared one
-- (tidegate.tasks; tasks_pkey), else 'default': where an async trigger's runs go, and
-- a run enqueued by name. Also the lane as given, and the task's declared key function
-- (code an enqueuer by name does not have).
SELECT route.lane, route.task, task_has_worker(route.lane, route.task, %(live_seconds)s::float8),
       given.lane AS given_lane, declared.key_function
FROM unnest(%(lanes)s::text[], %(tasks)s::text[]) AS given(lane, task)
LEFT JOIN tasks AS declared ON declared.name = given.task
CROSS JOIN LATERAL (
    SELECT coalesce(given.lane, declared.lane, 'default') AS lane, given.task
) AS route
