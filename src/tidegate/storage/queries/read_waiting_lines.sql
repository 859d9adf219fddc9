-- The waiting room's lines (waiting_places), per project and the limit they wait for:
-- the callers holding a live place, and the predicted wait, the seconds until the last
-- of them is due (a caller refused now is told at least that). The projects %(ids)s, or
-- every project when NULL (/metrics): at most scan_limit live places are read (one
-- probe of waiting_places_line per project of ids), and the longest max_lines lines
-- are reported. Lapsed places are skipped; the next refusal in their line deletes them.
SELECT project, waits_for, count(*)::integer AS callers,
       greatest(extract(epoch FROM max(due_at) - clock_timestamp()), 0)::float8 AS wait_seconds
FROM (
    SELECT project, waits_for, due_at FROM waiting_places
    WHERE lapses_at > clock_timestamp()
      AND (%(ids)s::text[] IS NULL OR project = ANY (%(ids)s::text[]))
    LIMIT %(scan_limit)s::integer
) AS live
GROUP BY project, waits_for
ORDER BY callers DESC, project, waits_for
LIMIT %(max_lines)s::integer
