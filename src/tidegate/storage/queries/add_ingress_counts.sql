-- An API process's webhook answers since its last flush (api/ledger.py): added to
-- ingress_counters and to this minute's admission counts, and the requests kept for
-- the webhook log inserted, in one statement. Other API processes add to the same
-- rows: each adds in the same order, so two flushes wait for each other, never deadlock.
WITH counts AS (
    SELECT * FROM jsonb_to_recordset(%(counters)s::jsonb) AS n(
        project text, mode text, outcome text, status smallint, requests bigint,
        seconds float8, buckets bigint[]
    )
),
counted AS (
    INSERT INTO ingress_counters AS c (project, mode, outcome, status, requests, seconds, buckets)
    SELECT project, mode, outcome, status, requests, seconds, buckets FROM counts
    ORDER BY project, mode, outcome, status
    ON CONFLICT (project, mode, outcome, status) DO UPDATE
    SET requests = c.requests + excluded.requests,
        seconds = c.seconds + excluded.seconds,
        buckets = add_buckets(c.buckets, excluded.buckets)
),
minutes AS (
    INSERT INTO minute_counts AS m (minute, source, project, lane, outcome, count)
    SELECT date_trunc('minute', now()), 'admission', project, '', outcome, sum(requests)
    FROM counts
    GROUP BY project, outcome
    ORDER BY project, outcome
    ON CONFLICT (minute, source, project, lane, task, outcome) DO UPDATE
    SET count = m.count + excluded.count
),
-- A trigger deleted meanwhile takes its log with it: its requests are not kept.
logged AS (
    INSERT INTO request_log (
        trigger_id, project, outcome, status, detail, run_id, idempotency_key,
        content_type, headers, body, body_truncated, received_at
    )
    SELECT r.trigger_id, r.project, r.outcome, r.status, r.detail, r.run_id,
           r.idempotency_key, r.content_type, r.headers, decode(r.body, 'base64'),
           r.body_truncated, r.received_at
    FROM jsonb_to_recordset(%(requests)s::jsonb) AS r(
        trigger_id bigint, project text, outcome text, status smallint, detail text,
        run_id bigint, idempotency_key text, content_type text, headers jsonb, body text,
        body_truncated boolean, received_at timestamptz
    )
    WHERE EXISTS (SELECT 1 FROM triggers WHERE triggers.id = r.trigger_id)
    ORDER BY r.received_at
    RETURNING 1
)
SELECT count(*) AS logged FROM logged
