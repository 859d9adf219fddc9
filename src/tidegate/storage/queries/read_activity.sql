-- The dashboard's charts: counts per minute of the last %(minutes)s minutes, from
-- minute_counts (an hour of rows at most; its primary key starts with the minute).
-- 'attempt' rows: finished attempts by lane, all outcomes together; they have no
-- project, so a project (%(project)s not NULL) gets none. 'admission' rows: webhook
-- answers by outcome, of one project or of all.
SELECT extract(epoch FROM minute)::bigint AS minute,
       source,
       CASE WHEN source = 'attempt' THEN lane ELSE outcome END AS series,
       sum(count)::bigint AS count
FROM minute_counts
WHERE minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s::integer)
  AND ((source = 'admission'
        AND (%(project)s::text IS NULL OR project = %(project)s))
       OR (source = 'attempt' AND %(project)s::text IS NULL))
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
