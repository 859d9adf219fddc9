-- Attempts finished, by (task, lane, outcome), for GET /metrics (docs/metrics.md).
--
-- A worker counts in memory and adds what it counted since its last heartbeat to its
-- own rows, in the heartbeat's statement: a completion writes nothing, and no two
-- workers write the same row. The rows of a worker that stopped or died are folded
-- into those of worker_id 'retired' (queries/fold_counters.sql),
-- so the table holds a few rows per live worker and the sums never go back. The
-- aggregate that sums their buckets (sum_buckets) was added here; see functions/.
CREATE TABLE worker_counters (
    worker_id text   NOT NULL,
    task      text   NOT NULL,
    lane      text   NOT NULL,
    -- succeeded, failed, retry_requested, discarded, cancelled, late (worker/counters.py)
    outcome   text   NOT NULL,
    attempts  bigint NOT NULL,
    -- The attempts' handler time, in seconds, in all.
    seconds   float8 NOT NULL,
    -- The attempts by handler time: one count per bucket of DURATION_BUCKETS, then one
    -- for longer (worker/counters.py); not cumulative.
    buckets   bigint[] NOT NULL,
    PRIMARY KEY (worker_id, task, lane, outcome)
);
