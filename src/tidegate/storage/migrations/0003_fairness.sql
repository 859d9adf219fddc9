-- Per-key concurrency limits, rates and weighted fairness, enforced at claim time.
--
-- Fairness is a virtual clock per key (start-time fair queuing). A run is stamped at
-- enqueue (and again when a delayed or retried run comes due) with
--     vtime = max(vtime of its key's newest ready run, the lane's clock) + n / weight
-- where the lane's clock is where claiming has got to: the newest vtime in flight (the
-- frontier), or the head of the ready runs when nothing runs. Claims take runs in
-- (rank, id) order, rank = vtime + priority * 64. A hot key's backlog spreads far into
-- the virtual future; a cold key's next run lands at the clock, next in line. A key that
-- was idle starts from the clock again, so it cannot bank credit. Priority is an offset
-- on the same clock: the clock passes a low-priority run in time, so nothing waits
-- forever. The clock is read from vtime, not rank: in a lane whose runs all have
-- priority 5 a cold key is still next in line. Enqueue writes no shared row: every
-- input is an index probe.

-- A key's policy in a lane; key '*' is the lane's default. Each field left NULL falls
-- back to the lane's default, then to none (weight: 1, rate_burst: 1).
CREATE TABLE key_policies (
    lane        text    NOT NULL,
    key         text    NOT NULL,
    max_running integer,            -- runs of the key in flight in the lane
    weight      float8,             -- the key's share of claims
    rate        float8,             -- runs started per second
    rate_burst  integer,            -- starts at once above the rate
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lane, key),
    CONSTRAINT key_policies_max_running_range CHECK (max_running >= 0),
    CONSTRAINT key_policies_weight_range CHECK (weight > 0),
    CONSTRAINT key_policies_rate_range CHECK (rate > 0),
    CONSTRAINT key_policies_rate_burst_range CHECK (rate_burst >= 1)
);

-- Whether any project has a concurrency limit, in one probe however many projects.
CREATE INDEX projects_with_concurrency ON projects (id) WHERE concurrency IS NOT NULL;

-- Each key's rate state (GCRA: the theoretical arrival time of its next start).
CREATE TABLE key_rates (
    lane text        NOT NULL,
    key  text        NOT NULL,
    tat  timestamptz NOT NULL,
    PRIMARY KEY (lane, key)
);

ALTER TABLE runs ADD COLUMN vtime float8 NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN rank float8 GENERATED ALWAYS AS (vtime + priority * 64) STORED;

DROP INDEX runs_claim_lane;
DROP INDEX runs_claim_any;

-- The claim of a named lane, and the lane's floor (its first entry).
CREATE INDEX runs_claim_lane ON runs (lane, rank, id) WHERE state = 'available';

-- Where the table holds one lane, ANALYZE finds one distinct value and the planner
-- expects `lane = $1` to match every row: the probe of a named lane then takes
-- runs_claim_any and filters it, reading the whole backlog to find an empty lane empty.
-- A fixed estimate of many lanes keeps the probe on runs_claim_lane.
ALTER TABLE runs ALTER COLUMN lane SET (n_distinct = 100);

-- The claim of `*`: every lane not named before it.
CREATE INDEX runs_claim_any ON runs (rank, id) WHERE state = 'available';

-- A key's newest ready run: where its next run's virtual time starts.
CREATE INDEX runs_key_ready ON runs (lane, key, vtime) WHERE state = 'available';

-- A key's runs in flight (runs_running, from 0001) are the ground truth of max_running
-- and of project concurrency: counted under an advisory lock, never kept in a counter.

-- How far claiming has got in each lane where limits gate keys: the newest vtime a
-- claim took, written once per claim (never per enqueue). Without it, a gated key's
-- backlog at the head of the order would be the clock, and everything behind it.
CREATE TABLE lane_clocks (
    lane     text   PRIMARY KEY,
    frontier float8 NOT NULL
);

-- The clock (key_weight, lane_frontier, key_clock) and the keyed claim were added here as
-- functions; see functions/.
