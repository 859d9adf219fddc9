-- Each lane's runs in the waiting and running states, and how long its oldest ready run
-- has been due: what GET /metrics reads at scrape time (read_lanes.sql), at a cost that
-- does not grow with the table or the backlog. No index exists for it: each figure is
-- read from an index a run is in anyway (docs/metrics.md, "What a scrape costs").
--
-- Lanes: the built-in ones, the paused ones, those with a ready run (ready_lanes: a skip
-- scan of runs_claim_lane), with a run in flight (a skip scan of runs_running), and those
-- of the scheduled and pending runs counted below, at most p_max_lanes in name order.
-- Depths: a lane's ready runs are counted from runs_claim_lane and its runs in flight
-- from runs_running, up to p_count_cap each and p_count_budget over the whole call;
-- scheduled and pending runs from runs_due and runs_pending, which hold every lane's,
-- up to p_count_cap each over all lanes. A count that reaches its limit is replaced by
-- the planner's estimate (estimate_runs), never lower than what was counted. Lag: the
-- oldest scheduled_at of the lane's ready runs counted: exact while they are under the
-- cap, the oldest of those counted past it. The states are literals in each count, so
-- that every plan, generic ones too, can use the partial indexes.
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
    -- Scheduled and pending runs of every lane, counted once for all lanes.
    due jsonb;
    parked jsonb;
    due_counted bigint;
    parked_counted bigint;
BEGIN
    SELECT coalesce(jsonb_object_agg(counted.lane, counted.n), '{}'), coalesce(sum(counted.n), 0)
    INTO due, due_counted
    FROM (
        SELECT waiting.lane, count(*) AS n FROM (
            SELECT runs.lane FROM runs WHERE runs.state = 'scheduled'
            ORDER BY runs.scheduled_at LIMIT p_count_cap
        ) AS waiting GROUP BY waiting.lane
    ) AS counted;
    SELECT coalesce(jsonb_object_agg(counted.lane, counted.n), '{}'), coalesce(sum(counted.n), 0)
    INTO parked, parked_counted
    FROM (
        SELECT waiting.lane, count(*) AS n FROM (
            SELECT runs.lane FROM runs WHERE runs.state = 'pending'
            ORDER BY runs.task LIMIT p_count_cap
        ) AS waiting GROUP BY waiting.lane
    ) AS counted;
    budget := budget - due_counted - parked_counted;
    FOR lane IN
        WITH RECURSIVE in_flight (lane, n) AS (
            SELECT min(runs.lane), 1 FROM runs WHERE runs.state = 'running'
            UNION ALL
            SELECT (SELECT min(runs.lane) FROM runs
                    WHERE runs.state = 'running' AND runs.lane > in_flight.lane),
                   in_flight.n + 1
            FROM in_flight WHERE in_flight.lane IS NOT NULL AND in_flight.n < p_max_lanes
        )
        SELECT found.lane FROM (
            SELECT ready.lane FROM ready_lanes('{}') AS ready
            UNION SELECT in_flight.lane FROM in_flight
            UNION SELECT jsonb_object_keys(due)
            UNION SELECT jsonb_object_keys(parked)
            UNION SELECT unnest(ARRAY['fast_lane', 'manual', 'default'])
            UNION SELECT paused_lanes.lane FROM paused_lanes
        ) AS found
        WHERE found.lane IS NOT NULL
        ORDER BY found.lane
        LIMIT p_max_lanes
    LOOP
        scheduled := coalesce((due ->> lane)::bigint, 0);
        IF due_counted >= p_count_cap THEN
            scheduled := greatest(scheduled, estimate_runs(lane, 'scheduled'));
        END IF;
        pending := coalesce((parked ->> lane)::bigint, 0);
        IF parked_counted >= p_count_cap THEN
            pending := greatest(pending, estimate_runs(lane, 'pending'));
        END IF;

        limited := greatest(least(p_count_cap, budget), 1);
        SELECT count(*), coalesce(greatest(0, extract(epoch FROM now() - min(counted.scheduled_at))), 0)
        INTO available, lag_seconds
        FROM (
            SELECT runs.scheduled_at FROM runs
            WHERE runs.lane = lane_figures.lane AND runs.state = 'available'
            LIMIT limited
        ) AS counted;
        budget := budget - available;
        IF available >= limited THEN
            available := greatest(available, estimate_runs(lane, 'available'));
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
        RETURN NEXT;
    END LOOP;
END
$$;
