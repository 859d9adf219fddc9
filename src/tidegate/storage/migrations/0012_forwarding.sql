-- Forwarding: a trigger that names a URL hands each webhook it admits to the built-in
-- task tidegate.forward, which sends the request as received to that URL (forward.py).

ALTER TABLE triggers
    ADD COLUMN forward_url             text,
    ADD COLUMN forward_method          text    NOT NULL DEFAULT 'POST',
    ADD COLUMN forward_headers         text[]  NOT NULL DEFAULT '{}',
    ADD COLUMN forward_timeout_seconds float8  NOT NULL DEFAULT 10,
    ADD COLUMN forward_secret          text,
    ADD COLUMN breaker_key             text,
    -- The same bounds as the admin API's, so that no other writer can store what the
    -- task could not send.
    ADD CONSTRAINT triggers_forward_url_valid
        CHECK (forward_url ~* '^https?://\S+$' AND length(forward_url) <= 2048),
    ADD CONSTRAINT triggers_forward_method_valid
        CHECK (forward_method IN ('POST', 'PUT', 'PATCH')),
    ADD CONSTRAINT triggers_forward_headers_range
        CHECK (cardinality(forward_headers) <= 32),
    ADD CONSTRAINT triggers_forward_timeout_range
        CHECK (forward_timeout_seconds > 0 AND forward_timeout_seconds <= 300),
    ADD CONSTRAINT triggers_breaker_key_range
        CHECK (length(breaker_key) BETWEEN 1 AND 255),
    -- A forwarding trigger's runs are the forwarding task's: any other handler would
    -- ignore the URL.
    ADD CONSTRAINT triggers_forward_task
        CHECK (forward_url IS NULL OR task = 'tidegate.forward');

-- The forwarding task finds the request it sends by its run: one lookup per attempt.
-- One more index entry per admitted webhook.
CREATE INDEX requests_run ON requests (run_id);
