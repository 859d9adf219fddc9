-- Each lane's runs in the waiting and running states, and how long its oldest ready run
-- has been due: what GET /metrics reads at scrape time (read_lanes.sql), at a cost that
-- does not grow with the table or the backlog.
--
-- Lanes: the built-in ones, and those with active runs, found by a skip scan (one probe
-- of runs_waiting or runs_running per lane, never a read of their runs), at most
-- p_max_lanes in name order. Depths: a lane's runs in a state are counted from that
-- state's partial index up to p_count_cap, and up to p_count_budget over the whole call;
-- a count that reaches its limit is replaced by the planner's estimate (estimate_runs),
-- never lower than what was counted. Lag: the oldest scheduled_at of the lane's ready
-- runs, the first entry of runs_waiting. The states are literals in each count, so that
-- every plan, generic ones too, can use the partial indexes.
CREATE OR REPLACE FUNCTION lane_figures(p_max_lanes integer, p_count_cap integer, p_count_budget integer)
RETURNS TABLE (
    lane text,
    scheduled bigint,
    available bigint,
    pending bigint,
    running bigint,
    lag_seconds float8
)
-- The skip scans' estimates make the planner expect dozens of lanes, and the cost of
-- counting each crosses jit_above_cost: compiling took 340 ms, the statement 5 ms.
SET jit = off
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    budget bigint := p_count_budget;
    limited bigint;
BEGIN
    FOR lane IN
        WITH RECURSIVE waiting (lane, n) AS (
            SELECT min(runs.lane), 1 FROM runs
            WHERE runs.state IN ('scheduled', 'available', 'pending')
            UNION ALL
            SELECT (SELECT min(runs.lane) FROM runs
                    WHERE runs.state IN ('scheduled', 'available', 'pending')
                      AND runs.lane > waiting.lane),
                   waiting.n + 1
            FROM waiting WHERE waiting.lane IS NOT NULL AND waiting.n < p_max_lanes
        ),
        in_flight (lane, n) AS (
            SELECT min(runs.lane), 1 FROM runs WHERE runs.state = 'running'
            UNION ALL
            SELECT (SELECT min(runs.lane) FROM runs
                    WHERE runs.state = 'running' AND runs.lane > in_flight.lane),
                   in_flight.n + 1
            FROM in_flight WHERE in_flight.lane IS NOT NULL AND in_flight.n < p_max_lanes
        )
        SELECT found.lane FROM (
            SELECT waiting.lane FROM waiting
            UNION SELECT in_flight.lane FROM in_flight
            UNION SELECT unnest(ARRAY['fast_lane', 'manual', 'default'])
        ) AS found
        WHERE found.lane IS NOT NULL
        ORDER BY found.lane
        LIMIT p_max_lanes
    LOOP
        limited := greatest(least(p_count_cap, budget), 1);
        SELECT count(*) INTO scheduled FROM (
            SELECT FROM runs WHERE runs.lane = lane_figures.lane AND runs.state = 'scheduled'
            LIMIT limited
        ) AS counted;
        budget := budget - scheduled;
        IF scheduled >= limited THEN
            scheduled := greatest(scheduled, estimate_runs(lane, 'scheduled'));
        END IF;

        limited := greatest(least(p_count_cap, budget), 1);
        SELECT count(*) INTO available FROM (
            SELECT FROM runs WHERE runs.lane = lane_figures.lane AND runs.state = 'available'
            LIMIT limited
        ) AS counted;
        budget := budget - available;
        IF available >= limited THEN
            available := greatest(available, estimate_runs(lane, 'available'));
        END IF;

        limited := greatest(least(p_count_cap, budget), 1);
        SELECT count(*) INTO pending FROM (
            SELECT FROM runs WHERE runs.lane = lane_figures.lane AND runs.state = 'pending'
            LIMIT limited
        ) AS counted;
        budget := budget - pending;
        IF pending >= limited THEN
            pending := greatest(pending, estimate_runs(lane, 'pending'));
        END IF;

        limited := greatest(least(p_count_cap, budget), 1);
        SELECT count(*) INTO running FROM (
            SELECT FROM runs WHERE runs.lane = lane_figures.lane AND runs.state = 'running'
            LIMIT limited
        ) AS counted;
        budget := budget - running;
        IF running >= limited THEN
            running := greatest(running, estimate_runs(lane, 'running'));
        END IF;

        SELECT coalesce(greatest(0, extract(epoch FROM now() - min(runs.scheduled_at))), 0)
        INTO lag_seconds
        FROM runs WHERE runs.lane = lane_figures.lane AND runs.state = 'available';
        RETURN NEXT;
    END LOOP;
END
$$;
