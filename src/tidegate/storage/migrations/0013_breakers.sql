-- Circuit breakers: one more claim-time policy per (lane, key), beside max_running and
-- rate. A key whose runs keep failing (its downstream is down) is "open": its runs are
-- not claimed, so they spend no attempt and hold no slot while the other keys get the
-- slots; after a cooldown it is "half-open" and lets a few probe runs through; a probe
-- that succeeds closes it, one that fails opens it again for twice as long (capped).
-- The breaker's functions, the claim's gate and admission's breaker_open were added
-- here; see functions/.

-- The policy, field by field with the lane's default '*' like the other key policies.
-- A key has a breaker when breaker_failures or breaker_ratio applies to it.
ALTER TABLE key_policies
    -- Open after this many failed attempts within the window...
    ADD COLUMN breaker_failures             integer,
    -- ...or when this share of the window's attempts failed, once it holds at least
    -- breaker_min_attempts (default 10).
    ADD COLUMN breaker_ratio                float8,
    ADD COLUMN breaker_min_attempts         integer,
    ADD COLUMN breaker_window_seconds       float8,  -- default 60
    ADD COLUMN breaker_cooldown_seconds     float8,  -- the first open period; default 30
    ADD COLUMN breaker_max_cooldown_seconds float8,  -- doubling stops here; default 600
    ADD COLUMN breaker_probes               integer, -- half-open: runs in flight; default 1
    -- The bounds of tidegate.policies, held by the database too.
    ADD CONSTRAINT key_policies_breaker_failures_range CHECK (breaker_failures >= 1),
    ADD CONSTRAINT key_policies_breaker_ratio_range CHECK (breaker_ratio > 0 AND breaker_ratio <= 1),
    ADD CONSTRAINT key_policies_breaker_min_attempts_range CHECK (breaker_min_attempts >= 1),
    ADD CONSTRAINT key_policies_breaker_window_range
        CHECK (breaker_window_seconds BETWEEN 0.1 AND 86400),
    ADD CONSTRAINT key_policies_breaker_cooldown_range
        CHECK (breaker_cooldown_seconds BETWEEN 0.1 AND 86400),
    ADD CONSTRAINT key_policies_breaker_max_cooldown_range
        CHECK (breaker_max_cooldown_seconds BETWEEN 0.1 AND 604800),
    ADD CONSTRAINT key_policies_breaker_probes_range CHECK (breaker_probes BETWEEN 1 AND 1000);

-- A breaker's state: one row per key that has failed lately, is open, or is forced;
-- a healthy key under a failure-count policy writes nothing. Written by the completion
-- statement (count_breaker_outcomes) and by an admin (forced); the claim only reads it.
-- Half-open is not stored: it is an open breaker whose open_until has passed.
CREATE TABLE key_breakers (
    lane              text        NOT NULL,
    key               text        NOT NULL,
    state             text        NOT NULL DEFAULT 'closed',
    forced            text,                     -- 'open' or 'closed': set by an admin
    window_started_at timestamptz NOT NULL DEFAULT now(),
    attempts          integer     NOT NULL DEFAULT 0,  -- counted in the window
    failures          integer     NOT NULL DEFAULT 0,
    opened_at         timestamptz,
    open_until        timestamptz,
    cooldown_seconds  float8,                   -- this open period's length
    trips             integer     NOT NULL DEFAULT 0,  -- times it opened
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lane, key),
    CONSTRAINT key_breakers_state_valid CHECK (state IN ('closed', 'open')),
    CONSTRAINT key_breakers_forced_valid CHECK (forced IN ('open', 'closed'))
);

-- Whether the claim took the run as a half-open breaker's probe: the probes in flight
-- are counted from the runs (ground truth: a finished or rescued probe frees its place
-- by leaving 'running'), and a probe's outcome, not an older run's, decides. Every
-- claim sets it. A new column with a constant default rewrites nothing.
ALTER TABLE runs ADD COLUMN probe boolean NOT NULL DEFAULT false;
