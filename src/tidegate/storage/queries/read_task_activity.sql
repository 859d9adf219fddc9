-- The dashboard's tasks page: finished attempts per minute of the last minutes, by
-- task, as completed or failed (the outcomes the page names each), for the tasks with
-- the most attempts.
-- Read from minute_counts, not from the finished runs: the hour's rows of the table (a
-- few per task, lane and minute, through its primary key, which starts with the
-- minute) cost the same however many runs finished in it; a run's failed attempts that
-- were retried are counted too, which the runs table no longer shows.
WITH counted AS (
    SELECT task,
           extract(epoch FROM minute)::bigint AS minute,
           CASE WHEN outcome = ANY (%(completed)s::text[]) THEN 'completed' ELSE 'failed' END
               AS series,
           sum(count)::bigint AS count
    FROM minute_counts
    WHERE minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s::integer)
      AND source = 'attempt'
      AND (outcome = ANY (%(completed)s::text[]) OR outcome = ANY (%(failed)s::text[]))
      AND task <> ''
    GROUP BY 1, 2, 3
),
busiest AS (
    SELECT task FROM counted
    GROUP BY task
    ORDER BY sum(count) DESC, task
    LIMIT %(max_tasks)s::integer
)
SELECT counted.task, minute, series, count
FROM counted JOIN busiest USING (task)
ORDER BY 1, 2, 3
