-- Live progress: what a handler reports while its run executes (run.progress), read by
-- GET /runs/{id}/events and by a sync webhook's caller that asks for server-sent
-- events. The id orders a run's events (one worker writes them, in order, and only
-- while it holds the run) and is the SSE event id a client resumes from.
CREATE TABLE run_events (
    id      bigint      GENERATED ALWAYS AS IDENTITY,
    run_id  bigint      NOT NULL,
    attempt smallint    NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    data    jsonb       NOT NULL,
    PRIMARY KEY (run_id, id)
);

-- Set by a reader of the run's events while the run has not finished: its final
-- transition then NOTIFYs the completed channel as a fast-lane run's does. Written on
-- the run's row (not in a table of watchers) so that the reader's update and the run's
-- last transition are ordered by the row's lock: whichever comes second sees the other.
ALTER TABLE runs ADD COLUMN watched boolean NOT NULL DEFAULT false;
