-- For each (lane, task): whether a live worker has the task and a workloop for the lane
-- (functions/task_has_worker.sql).
SELECT route.lane, route.task, task_has_worker(route.lane, route.task, %(live_seconds)s::float8)
FROM unnest(%(lanes)s::text[], %(tasks)s::text[]) AS route(lane, task)
