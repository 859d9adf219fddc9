-- Return once everything committed before is on disk: a transaction given an id commits
-- through the WAL flush (the API's connections keep synchronous_commit on), and the WAL
-- is flushed in order, so an admission committed without waiting (admit_webhook.sql,
-- durable false) is durable once this returns.
SELECT pg_current_xact_id()
