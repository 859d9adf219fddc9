-- What /readyz needs: the schema's version (the database answers, and is migrated).
SELECT coalesce(max(version), 0) AS schema_version FROM migrations
