-- Admit one webhook or say why not: see functions/admit_webhook.sql for the checks and
-- their order. It commits through the WAL flush, a sync webhook's too: its run must be
-- on disk before a worker can start it.
SELECT * FROM admit_webhook(
    %(trigger_id)s, %(project)s, %(lane)s::text, %(task)s, %(key)s, %(args)s::jsonb,
    %(max_attempts)s::smallint, %(idempotency_key)s, %(content_type)s, %(headers)s::jsonb,
    %(body)s, %(default_fast_lane_cap)s, %(live_seconds)s::float8, %(channel)s,
    %(ticket)s::uuid, %(place_grace)s::float8, %(max_places)s,
    %(default_max_attempts)s::smallint, %(unique_key)s::text, %(unique_states)s::run_state[]
)
