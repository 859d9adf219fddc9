-- The places in a line of the waiting room (waiting_places) ahead of a caller, counted up
-- to p_room, and the caller's own place if it brought the ticket of a live one. A caller
-- is admitted only when the room a limit has is more than the places ahead of it: room
-- that frees goes to those first in line, never to a caller behind them or a newcomer
-- (which has every live place ahead of it). On the admitted path with an empty line this
-- is one probe of waiting_places_line (and one of waiting_places_ticket with a ticket).
CREATE OR REPLACE FUNCTION places_ahead(
    p_project text, p_waits_for text, p_key text, p_ticket uuid, p_room integer,
    OUT ahead integer, OUT mine bigint
)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_ticket IS NOT NULL THEN
        SELECT w.id INTO mine FROM waiting_places w
        WHERE w.ticket = p_ticket AND w.project = p_project AND w.waits_for = p_waits_for
          AND w.key = p_key AND w.lapses_at > clock_timestamp();
    END IF;
    SELECT count(*) INTO ahead FROM (
        SELECT 1 FROM waiting_places w
        WHERE w.project = p_project AND w.waits_for = p_waits_for AND w.key = p_key
          AND w.id < coalesce(mine, 9223372036854775807)
          AND w.lapses_at > clock_timestamp()
        LIMIT greatest(p_room, 0)
    ) AS line;
END
$$;
