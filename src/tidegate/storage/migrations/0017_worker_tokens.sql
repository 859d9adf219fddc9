-- Remote workers: processes that reach the API over HTTP, not PostgreSQL (docs/workers.md).
-- The admin gives each fleet a token scoped to lanes; the API registers its workers in
-- the same workers table as local ones (so admission counts their fast-lane slots), and
-- claims, renews and completes for them with the same statements.
CREATE TABLE worker_tokens (
    name       text        PRIMARY KEY,
    token_hash text        NOT NULL UNIQUE,   -- sha256 of the token, never the token
    -- The lanes its workers may claim from; '*' among them: any lane.
    lanes      text[]      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT worker_tokens_name_format CHECK (name ~ '^[A-Za-z0-9_.-]{1,64}$'),
    CONSTRAINT worker_tokens_some_lane CHECK (cardinality(lanes) BETWEEN 1 AND 64)
);

-- The token a remote worker registered with (its name); NULL for a local worker.
ALTER TABLE workers ADD COLUMN token text;
