-- What GET /metrics reads at scrape time (queries/read_lanes.sql): each lane's depth in
-- the waiting states and the age of its oldest ready run, at a cost that does not grow
-- with the table or the backlog. The functions that read them (lane_figures,
-- estimate_runs) were added here; see functions/.

-- The waiting runs of each lane, by state, oldest due first: the lanes (a skip scan),
-- a count per (lane, state) that stops at a cap, and the oldest ready run of a lane,
-- each a few probes. Running runs are not in it: runs_running has their lanes already,
-- and a claim (available -> running) then writes no entry here; enqueue, staging and
-- retries write one.
CREATE INDEX runs_waiting ON runs (lane, state, scheduled_at)
    WHERE state IN ('scheduled', 'available', 'pending');

-- How runs spread over (lane, state) together. Without it the planner multiplies the
-- two columns' frequencies, as if independent: on a table of 900,000 succeeded runs in
-- `default` and 25,000 ready ones in each of four lanes, it took `default` to hold
-- 0.9 x 0.1 of the table ready. estimate_runs reads what it knows.
CREATE STATISTICS runs_lane_state (mcv) ON lane, state FROM runs;
