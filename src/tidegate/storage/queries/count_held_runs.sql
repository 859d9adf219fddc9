-- The runs a workloop of a worker holds now (runs_running holds every running run, and
-- there are never more than the cluster's slots of them). A claim counts them under the
-- workloop's lock (lock_workloop.sql), in the transaction that claims the rest.
SELECT count(*) FROM runs
WHERE state = 'running' AND worker_id = %(worker_id)s AND workloop = %(workloop)s
