-- Give a refused caller its place in a line of the waiting room, or keep the one it has
-- (p_mine), and say when room will be free for it: the seconds from now to its place's
-- due time, and how many live places are ahead of it.
--
-- The ingest rate's place (p_reserved): p_first_at is the instant the rate reserved for
-- it (admit_webhook), one interval after the place ahead's; due_at holds that instant,
-- from which on its caller is admitted (the RateLimit field's `due` says it to the
-- millisecond), so any number of places may share a whole second.
-- A cap's place (the fast lane's, a key's backlog): the due time is a promise kept by
-- the line itself. Room frees one place every p_interval seconds (what the cap measured:
-- the fast-lane runs' durations over the cap, the backlog's rate of starts), the first
-- at p_first_at, and a place is due one interval after the place ahead of it, at the
-- earliest:
--     due = greatest(p_first_at + (ahead - p_room) * p_interval,
--                    promise of the last place ahead + p_interval)
-- A caller is told whole seconds (Retry-After), so it comes back at the promise, the due
-- time rounded up, or later: its admission starts then, and the places behind it are
-- scheduled from that promise (due_at holds it). Scheduled from the due times instead,
-- the line ran ahead of the cap by up to a second per place, and 42-49% of the callers
-- that came back at their time were refused again; scheduled from the promise of the
-- place a cap ahead (a cap's worth of callers sharing a second), 32-52%: a caller
-- refused again keeps its place ahead of those behind it, who then need its room too.
-- Room freed before a caller comes back waits for it (places_ahead).
-- A new place gets p_ticket where the caller holds one already (a place of the rate's
-- line that came due, kept beside the cap's: admit_webhook), so the caller still holds
-- one ticket; otherwise a new, random one.
-- A place lapses p_grace seconds after the whole second its caller was told (Retry-After
-- is in whole seconds); lapsed places of the line are deleted here. A line holds at most
-- p_max_places live places: past that a caller is told when the end of the line is due,
-- and gets no place.
CREATE OR REPLACE FUNCTION take_place(
    p_project text, p_waits_for text, p_key text, p_mine bigint, p_ticket uuid,
    p_reserved boolean, p_room integer, p_first_at timestamptz, p_interval float8, p_grace float8,
    p_max_places integer, OUT ticket uuid, OUT ahead integer, OUT wait float8
)
LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := clock_timestamp();
    last_due timestamptz;
    due timestamptz;
    promise timestamptz;
    told float8;
BEGIN
    DELETE FROM waiting_places w
    WHERE w.project = p_project AND w.waits_for = p_waits_for AND w.key = p_key
      AND w.lapses_at <= now_at;
    SELECT count(*), max(w.due_at) INTO ahead, last_due FROM waiting_places w
    WHERE w.project = p_project AND w.waits_for = p_waits_for AND w.key = p_key
      AND w.id < coalesce(p_mine, 9223372036854775807);
    IF p_reserved THEN
        due := greatest(p_first_at, now_at);
    ELSE
        due := greatest(
            p_first_at + make_interval(secs => greatest(ahead - p_room, 0) * p_interval),
            last_due + make_interval(secs => p_interval),
            now_at
        );
    END IF;
    wait := extract(epoch FROM due - now_at);
    told := greatest(ceil(wait), 1);  -- Retry-After: whole seconds, at least one
    promise := now_at + make_interval(secs => told);
    IF NOT p_reserved THEN
        due := promise;
    END IF;
    IF p_mine IS NOT NULL THEN
        UPDATE waiting_places w
        SET due_at = due, lapses_at = promise + make_interval(secs => p_grace)
        WHERE w.id = p_mine
        RETURNING w.ticket INTO ticket;
    ELSIF ahead < p_max_places THEN
        INSERT INTO waiting_places (project, waits_for, key, ticket, due_at, lapses_at)
        VALUES (p_project, p_waits_for, p_key, coalesce(p_ticket, gen_random_uuid()), due,
                promise + make_interval(secs => p_grace))
        RETURNING waiting_places.ticket INTO ticket;
    END IF;
    IF p_ticket IS NOT NULL THEN  -- its reservation lives as long as this place
        UPDATE waiting_places w
        SET lapses_at = greatest(w.lapses_at, promise + make_interval(secs => p_grace))
        WHERE w.ticket = p_ticket AND w.waits_for = 'ingest';
    END IF;
END
$$;
