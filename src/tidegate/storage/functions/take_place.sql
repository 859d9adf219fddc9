-- Give a refused caller its place in a line of the waiting room, or keep the one it has
-- (p_mine, from places_ahead), and say when room will be free for it: the seconds from
-- now to its place's due time, and how many live places are ahead of it.
--
-- The due time is a promise kept by the line itself: room frees one place every
-- p_interval seconds (what the limit measured: the ingest rate's emission interval, the
-- fast-lane runs' durations over the cap, the backlog's rate of starts), the first at
-- p_first_at, and a place is due one interval after the place ahead of it, at the
-- earliest:
--     due = greatest(p_first_at + (ahead - p_room) * p_interval,
--                    promised time of the last place ahead + p_interval)
-- A caller is told whole seconds (Retry-After), so it comes back at the promised time,
-- the due time rounded up, or later: its admission starts then, not at the due time,
-- and the places behind it are scheduled from that promise (due_at holds it). Scheduled
-- from the due times instead, the line ran ahead of the limit by up to a second per
-- place and 42-49% of the callers that came back at their time were refused again.
-- Room freed before a caller comes back waits for it (places_ahead), so a caller that
-- comes back at its time finds it, unless the limit frees room more slowly than
-- measured; it then keeps its place, first in line, and is told again.
-- A place lapses p_grace seconds after the whole second its caller was told (Retry-After
-- is in whole seconds); lapsed places of the line are deleted here. A line holds at most
-- p_max_places live places: past that a caller is told when the end of the line is due,
-- and gets no place.
CREATE OR REPLACE FUNCTION take_place(
    p_project text, p_waits_for text, p_key text, p_mine bigint, p_room integer,
    p_first_at timestamptz, p_interval float8, p_grace float8, p_max_places integer,
    OUT ticket uuid, OUT ahead integer, OUT wait float8
)
LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := clock_timestamp();
    last_due timestamptz;
    due timestamptz;
    told float8;
BEGIN
    DELETE FROM waiting_places w
    WHERE w.project = p_project AND w.waits_for = p_waits_for AND w.key = p_key
      AND w.lapses_at <= now_at;
    SELECT count(*), max(w.due_at) INTO ahead, last_due FROM waiting_places w
    WHERE w.project = p_project AND w.waits_for = p_waits_for AND w.key = p_key
      AND w.id < coalesce(p_mine, 9223372036854775807);
    due := greatest(
        p_first_at + make_interval(secs => greatest(ahead - p_room, 0) * p_interval),
        last_due + make_interval(secs => p_interval),
        now_at
    );
    wait := extract(epoch FROM due - now_at);
    told := greatest(ceil(wait), 1);  -- Retry-After: whole seconds, at least one
    due := now_at + make_interval(secs => told);  -- the promise
    IF p_mine IS NOT NULL THEN
        UPDATE waiting_places w
        SET due_at = due, lapses_at = due + make_interval(secs => p_grace)
        WHERE w.id = p_mine
        RETURNING w.ticket INTO ticket;
    ELSIF ahead < p_max_places THEN
        INSERT INTO waiting_places (project, waits_for, key, due_at, lapses_at)
        VALUES (p_project, p_waits_for, p_key, due, due + make_interval(secs => p_grace))
        RETURNING waiting_places.ticket INTO ticket;
    END IF;
END
$$;
