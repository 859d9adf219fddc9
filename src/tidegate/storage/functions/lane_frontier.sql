-- How far claiming has got in a lane: the newest vtime a claim took (lane_clocks,
-- written once per claim, never per enqueue) or in flight (runs_running). A key gated by
-- its limits keeps its old runs at the head of the lane's order; the frontier moves on
-- without them, so they do not hold the clock back, and with it every key behind them.
-- Read by key_clock, by the keyed claim's second phase, and by the rescuer and the
-- release of runs (rescue_runs.sql, release_runs.sql) that put runs back at the clock.
CREATE OR REPLACE FUNCTION lane_frontier(p_lane text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN greatest(
        (SELECT frontier FROM lane_clocks WHERE lane = p_lane),
        (SELECT max(vtime) FROM runs WHERE lane = p_lane AND state = 'running')
    );
END
$$;
