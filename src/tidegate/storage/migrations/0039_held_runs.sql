-- A worker's runs in flight, read from its own entries (schema.sql says more): a batch
-- of outcomes (complete_runs), a remote claim's count of its workloop's runs (held_runs)
-- and the fast lane's free slots (admit_webhook) read every run in flight of the
-- cluster through runs_running, and every entry a finished run left there until a
-- vacuum. Built without CONCURRENTLY, inside the migration: writes to runs wait for it
-- (a scan of the table; it holds only the runs in flight).
CREATE INDEX runs_held ON runs (worker_id, workloop) WHERE state = 'running';
