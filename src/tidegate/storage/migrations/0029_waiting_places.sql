-- The waiting room of admission (schema.sql says why each column and index).
-- The waiting room: a place for each caller refused for a limit (a project's fast-lane
-- cap, its ingest rate, a key's backlog cap), in the order they were refused (id). A
-- caller that comes back with its ticket is admitted before any caller behind it: the
-- room a limit frees goes to the places first in line (admit_webhook, take_place).
-- A place lapses when its caller has not come back by lapses_at; nothing reads a lapsed
-- place, and the next refusal in its line deletes it.
CREATE TABLE waiting_places (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project    text        NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    -- The limit the line waits for: 'fast_lane', 'ingest' or 'backlog'.
    waits_for  text        NOT NULL,
    -- The backlog's key ('' for the project's own limits).
    key        text        NOT NULL,
    -- What the caller holds (the Tidegate-Place field): random, so a forged one finds
    -- no place.
    ticket     uuid        NOT NULL DEFAULT gen_random_uuid(),
    -- When the caller was told to come back (Retry-After, whole seconds): the promise
    -- the places behind it are scheduled from.
    due_at     timestamptz NOT NULL,
    lapses_at  timestamptz NOT NULL
);

-- A line, in order: the places ahead of a caller, counted up to the room there is.
CREATE INDEX waiting_places_line ON waiting_places (project, waits_for, key, id);

-- A caller's place, by the ticket it brings back.
CREATE UNIQUE INDEX waiting_places_ticket ON waiting_places (ticket);
