-- A ready run in three indexes (runs_pkey, runs_claim_lane, runs_key_ready), down from
-- six: `*` claims through a skip scan of runs_claim_lane (functions/ready_lanes.sql), so
-- runs_claim_any goes; the lane metrics count from the indexes each state is in anyway
-- (functions/lane_figures.sql), so runs_waiting goes; runs_project holds the runs at rest
-- only, as ready runs are read through the claim's indexes (schema.sql says why).
--
-- No run moves: the table is the same, only its indexes change, and the service can run
-- through it. The new runs_project is built first, under a lock that lets reads (claims
-- among them: they lock rows, not the table) go on and makes writes of runs wait for the
-- build (a scan of the table: a few seconds per million runs); the drops come last, and
-- hold the table only for the instant before the commit.
CREATE INDEX runs_project_at_rest ON runs (project, id) WHERE state NOT IN ('available', 'running');
DROP INDEX runs_claim_any;
DROP INDEX runs_waiting;
DROP INDEX runs_project;
ALTER INDEX runs_project_at_rest RENAME TO runs_project;
