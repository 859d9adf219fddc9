-- Each lane's depth by state and its lag: a function (functions/lane_figures.sql), so
-- that its plans are kept for the connection's life and its statements are never
-- JIT-compiled.
SELECT lane, scheduled, available, pending, running, lag_seconds
FROM lane_figures(%(max_lanes)s::integer, %(count_cap)s::integer, %(count_budget)s::integer)
