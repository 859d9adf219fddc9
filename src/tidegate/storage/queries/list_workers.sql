-- Every worker row, the most recent heartbeat first: its workloops (chain, slots,
-- busy at the last heartbeat), its tasks and how old its heartbeat is. A worker that
-- stopped cleanly has no row; one that died keeps its row, its heartbeat ageing.
-- Workers are few; the limit only guards the page.
SELECT id, host, pid, workloops, tasks, started_at,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_seconds
FROM workers
ORDER BY heartbeat_at DESC, id
LIMIT %(limit)s::integer
