-- See the function admit_webhook (migration 0013; 0007 and 0002 before it) for the
-- checks and their order.
-- durable: whether the commit waits for the WAL flush. A sync webhook's admission does
-- not, so that its run can start at once: the API waits for the flush (flush_wal.sql)
-- beside the run, before any answer. An async webhook's 202 follows its commit: it waits.
SELECT admitted.*
FROM set_config(
         'synchronous_commit',
         CASE WHEN %(durable)s::boolean THEN current_setting('synchronous_commit') ELSE 'off' END,
         true
     ) AS durability,
     admit_webhook(
         %(trigger_id)s, %(project)s, %(lane)s, %(task)s, %(key)s, %(args)s::jsonb,
         %(max_attempts)s::smallint, %(idempotency_key)s, %(content_type)s, %(headers)s::jsonb,
         %(body)s, %(default_fast_lane_cap)s, %(live_seconds)s::float8, %(channel)s
     ) AS admitted
