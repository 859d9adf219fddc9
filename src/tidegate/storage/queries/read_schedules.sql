-- Schedules for /metrics: how many are active, paused and failing (their last tick made
-- no run), each counted up to count_cap; and how long the most overdue active one has
-- been due (0: none), from the first entry of schedules_due.
SELECT
    (SELECT count(*) FROM (SELECT FROM schedules WHERE NOT paused LIMIT %(count_cap)s) s),
    (SELECT count(*) FROM (SELECT FROM schedules WHERE paused LIMIT %(count_cap)s) s),
    (SELECT count(*) FROM (SELECT FROM schedules WHERE last_error IS NOT NULL
                           LIMIT %(count_cap)s) s),
    greatest(extract(epoch FROM now() - (SELECT min(next_tick) FROM schedules
                                         WHERE NOT paused))::float8, 0)
