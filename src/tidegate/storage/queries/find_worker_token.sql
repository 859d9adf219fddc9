-- The worker token whose sha256 this is: its name and lanes (worker_tokens_token_hash_key),
-- and the workloops and tasks of the worker %(worker_id)s if it registered with this
-- token (workers_pkey; NULL otherwise, or with no worker named): a call of a worker's own
-- reads both in the one statement its token is checked with (api/guard.py).
SELECT t.name, t.lanes, w.workloops, w.tasks
FROM worker_tokens t
LEFT JOIN workers w ON w.id = %(worker_id)s::text AND w.token = t.name
WHERE t.token_hash = %(token_hash)s
