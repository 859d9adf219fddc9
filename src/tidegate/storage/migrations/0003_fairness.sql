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

-- The weight of a key in a lane: its own policy, else the lane's default, else 1.
CREATE FUNCTION key_weight(p_lane text, p_key text) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT weight FROM key_policies WHERE lane = p_lane AND key = p_key),
        (SELECT weight FROM key_policies WHERE lane = p_lane AND key = '*'),
        1.0
    )
$$;

-- How far claiming has got in each lane where limits gate keys: the newest vtime a
-- claim took, written once per claim (never per enqueue). Without it, a gated key's
-- backlog at the head of the order would be the clock, and everything behind it.
CREATE TABLE lane_clocks (
    lane     text   PRIMARY KEY,
    frontier float8 NOT NULL
);

-- The lane's frontier: the newest vtime claimed (lane_clocks) or in flight
-- (runs_running). A gated key's old runs at the head of the order do not hold it back.
CREATE FUNCTION lane_frontier(p_lane text) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT greatest(
        (SELECT frontier FROM lane_clocks WHERE lane = p_lane),
        (SELECT max(vtime) FROM runs WHERE lane = p_lane AND state = 'running')
    )
$$;

-- Where a key's next run goes: after the key's newest ready run (runs_key_ready), and
-- never before the lane's clock: its frontier, or the vtime at the head of its ready
-- runs (runs_claim_lane) when that is further on.
CREATE FUNCTION key_clock(p_lane text, p_key text) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT greatest(
        (SELECT vtime FROM runs
         WHERE lane = p_lane AND key = p_key AND state = 'available'
         ORDER BY vtime DESC LIMIT 1),
        lane_frontier(p_lane),
        (SELECT vtime FROM runs
         WHERE lane = p_lane AND state = 'available'
         ORDER BY rank, id LIMIT 1),
        0
    )
$$;

-- Claim up to p_demand runs for one workloop, following its lane chain, with every
-- key's limits enforced in the same transaction. (Where no limits are set anywhere, the
-- claim statement, queries/claim_runs.sql, takes runs in one set-based step instead.)
--
-- Sources in chain order: each named lane, then (with `*`) every other lane; each is
-- one ordered scan of its index, locking rows as it reads them (SKIP LOCKED: claimers
-- pass each other). A candidate is taken unless its key is gated:
--   max_running  the key's runs in flight in the lane, counted from the runs table
--                under a transaction-scoped advisory lock on (lane, key). Each count is
--                its own statement, so it sees every claim committed before the lock
--                was taken: exact across any number of workers. A key whose lock another
--                claimer holds is skipped this time, like a locked row.
--   concurrency  the same for the run's project across every lane but fast_lane.
--   rate         the key's GCRA state in key_rates, advanced only for runs taken.
-- fast_lane runs are exempt (their bound is admission's per-project cap).
-- The scan stops after p_scan_limit rows: a claim's cost is bounded whatever the
-- backlog of a gated key; the keys' spread on the clock keeps eligible runs near the
-- head.
CREATE FUNCTION claim_runs(
    p_lanes text[],
    p_wildcard boolean,
    p_demand integer,
    p_worker_id text,
    p_workloop smallint,
    p_lease_seconds float8,
    p_scan_limit integer,
    p_head_scan integer
) RETURNS SETOF runs
-- The candidate cursors have no LIMIT, so on a large backlog their estimated cost
-- crosses jit_above_cost, and compiling them cost more than the whole claim (measured
-- 5 ms per claim at 1,000,000 runs on PostgreSQL 15).
SET jit = off
LANGUAGE plpgsql AS $$
DECLARE
    sources integer := cardinality(p_lanes) + p_wildcard::integer;
    source integer;
    phase integer;
    head_scanned integer;
    last_rank float8;
    last_id bigint;
    frontier float8;
    candidates refcursor;
    candidate record;
    max_running integer;
    rate float8;
    rate_burst integer;
    picked bigint[] := '{}';
    gated text[] := '{}';
    taken jsonb := '{}';
    scanned integer := 0;
    gate text;
    project_gate text;
    in_flight integer;
    cap integer;
    tat timestamptz;
    any_policy boolean := EXISTS (SELECT 1 FROM key_policies);
    any_concurrency boolean := EXISTS (SELECT 1 FROM projects WHERE concurrency IS NOT NULL);
BEGIN
    FOR source IN 1 .. sources LOOP
        -- Phase 1 reads the head of the order, where keys that were at their limits
        -- wait; phase 2 goes on from the lane's frontier, past whatever gated backlog
        -- the head holds, so a capped key's runs never hold up the keys behind them.
        FOR phase IN 1 .. 2 LOOP
            IF phase = 1 THEN
                head_scanned := 0;
            ELSE
                EXIT WHEN head_scanned < p_head_scan OR cardinality(picked) >= p_demand;
                IF source <= cardinality(p_lanes) THEN
                    frontier := lane_frontier(p_lanes[source]);
                ELSE
                    SELECT min(lane_frontier(lane)) INTO frontier
                    FROM (SELECT DISTINCT lane FROM runs WHERE state = 'running') AS busy
                    WHERE lane <> ALL(p_lanes);
                END IF;
            END IF;
            IF source <= cardinality(p_lanes) AND phase = 1 THEN
                OPEN candidates FOR
                    SELECT id, lane, key, project, rank FROM runs
                    WHERE lane = p_lanes[source] AND state = 'available'
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            ELSIF source <= cardinality(p_lanes) THEN
                OPEN candidates FOR
                    SELECT id, lane, key, project, rank FROM runs
                    WHERE lane = p_lanes[source] AND state = 'available'
                      AND (rank, id) > (last_rank, last_id)
                      AND rank >= coalesce(frontier, '-infinity')
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            ELSIF phase = 1 THEN
                OPEN candidates FOR
                    SELECT id, lane, key, project, rank FROM runs
                    WHERE lane <> ALL(p_lanes) AND state = 'available'
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            ELSE
                OPEN candidates FOR
                    SELECT id, lane, key, project, rank FROM runs
                    WHERE lane <> ALL(p_lanes) AND state = 'available'
                      AND (rank, id) > (last_rank, last_id)
                      AND rank >= coalesce(frontier, '-infinity')
                    ORDER BY rank, id
                    FOR UPDATE SKIP LOCKED;
            END IF;
            LOOP
                FETCH candidates INTO candidate;
                EXIT WHEN NOT FOUND;
                IF phase = 1 THEN
                    EXIT WHEN head_scanned = p_head_scan;
                    head_scanned := head_scanned + 1;
                    last_rank := candidate.rank;
                    last_id := candidate.id;
                END IF;
                scanned := scanned + 1;
                EXIT WHEN scanned > p_scan_limit;
                gate := candidate.lane || '/' || candidate.key;
                project_gate := '/project/' || candidate.project;
                CONTINUE WHEN gate = ANY(gated) OR project_gate = ANY(gated);
                IF candidate.lane <> 'fast_lane' THEN
                    max_running := NULL;
                    rate := NULL;
                    IF any_policy THEN
                        SELECT coalesce(own.max_running, lane_default.max_running),
                               coalesce(own.rate, lane_default.rate),
                               coalesce(own.rate_burst, lane_default.rate_burst, 1)
                        INTO max_running, rate, rate_burst
                        FROM (SELECT) AS one
                        LEFT JOIN key_policies own
                            ON own.lane = candidate.lane AND own.key = candidate.key
                        LEFT JOIN key_policies lane_default
                            ON lane_default.lane = candidate.lane AND lane_default.key = '*';
                    END IF;
                    IF max_running IS NOT NULL THEN
                        IF NOT pg_try_advisory_xact_lock(hashtextextended('tidegate.key/' || gate, 0)) THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                        SELECT count(*) INTO in_flight FROM runs
                        WHERE lane = candidate.lane AND key = candidate.key AND state = 'running';
                        IF in_flight + coalesce((taken ->> gate)::integer, 0) >= max_running THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                    END IF;
                    cap := NULL;
                    IF any_concurrency THEN
                        SELECT concurrency INTO cap FROM projects WHERE id = candidate.project;
                    END IF;
                    IF cap IS NOT NULL THEN
                        IF NOT pg_try_advisory_xact_lock(hashtextextended('tidegate.project/' || candidate.project, 0)) THEN
                            gated := gated || project_gate;
                            CONTINUE;
                        END IF;
                        SELECT count(*) INTO in_flight FROM runs
                        WHERE project = candidate.project AND lane <> 'fast_lane' AND state = 'running';
                        IF in_flight + coalesce((taken ->> project_gate)::integer, 0) >= cap THEN
                            gated := gated || project_gate;
                            CONTINUE;
                        END IF;
                    END IF;
                    IF rate IS NOT NULL THEN
                        -- GCRA per key; the row lock serializes claimers of the same key.
                        INSERT INTO key_rates AS r (lane, key, tat)
                        VALUES (candidate.lane, candidate.key,
                                now() + make_interval(secs => 1.0 / rate))
                        ON CONFLICT (lane, key) DO UPDATE
                        SET tat = greatest(r.tat, now()) + make_interval(secs => 1.0 / rate)
                        WHERE greatest(r.tat, now())
                              <= now() + make_interval(secs => (rate_burst - 1) / rate)
                        RETURNING r.tat INTO tat;
                        IF NOT FOUND THEN
                            gated := gated || gate;
                            CONTINUE;
                        END IF;
                    END IF;
                    taken := taken
                        || jsonb_build_object(gate, coalesce((taken ->> gate)::integer, 0) + 1)
                        || jsonb_build_object(project_gate, coalesce((taken ->> project_gate)::integer, 0) + 1);
                END IF;
                picked := picked || candidate.id;
                EXIT WHEN cardinality(picked) >= p_demand;
            END LOOP;
            CLOSE candidates;
            EXIT WHEN scanned > p_scan_limit OR cardinality(picked) >= p_demand;
        END LOOP;
        EXIT WHEN scanned > p_scan_limit OR cardinality(picked) >= p_demand;
    END LOOP;
    INSERT INTO lane_clocks AS c (lane, frontier)
    SELECT lane, max(vtime) FROM runs WHERE id = ANY(picked) GROUP BY lane
    ON CONFLICT (lane) DO UPDATE SET frontier = greatest(c.frontier, excluded.frontier);

    RETURN QUERY
        UPDATE runs
        SET state = 'running',
            attempt = attempt + 1,
            attempted_at = now(),
            worker_id = p_worker_id,
            workloop = p_workloop,
            lease_expires_at = now() + make_interval(secs => p_lease_seconds)
        WHERE id = ANY(picked)
        RETURNING *;
END
$$;
