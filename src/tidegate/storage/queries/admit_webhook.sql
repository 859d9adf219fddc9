-- See the function admit_webhook (migration 0013; 0007 and 0002 before it) for the
-- checks and their order.
SELECT * FROM admit_webhook(
    %(trigger_id)s, %(project)s, %(lane)s, %(task)s, %(key)s, %(args)s::jsonb,
    %(max_attempts)s::smallint, %(idempotency_key)s, %(content_type)s, %(headers)s::jsonb,
    %(body)s, %(default_fast_lane_cap)s, %(live_seconds)s::float8, %(channel)s
)
