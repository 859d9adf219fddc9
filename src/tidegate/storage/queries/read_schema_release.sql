-- Whether the schema serves a release's code (migrate.SchemaRelease), read at a
-- process's start and by /readyz: the schema's version; the oldest version whose code
-- its newest release serves (that release's serves_from, or the version itself where
-- the newest migration was recorded by no release); and whether the release of
-- %(version)s with the functions %(functions)s is recorded (its functions, or those of
-- a later release of the same version, are the schema's).
WITH applied AS (
    SELECT coalesce(max(version), 0) AS version FROM migrations
), newest AS (
    SELECT version, serves_from FROM releases ORDER BY position DESC LIMIT 1
)
SELECT applied.version,
       CASE WHEN newest.version = applied.version
            THEN newest.serves_from ELSE applied.version END AS serves_from,
       EXISTS (
           SELECT 1 FROM releases
           WHERE version = %(version)s::integer AND functions = %(functions)s::text
       ) AS served
FROM applied LEFT JOIN newest ON true
