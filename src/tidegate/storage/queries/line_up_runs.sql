-- Put in their key's line (in_line, runs_key_line) the unfinished runs of the keys a
-- policy just made ordered: the key's own, or, for the lane's default (key '*'), every
-- key of the lane whose own policy does not say. Runs enqueued from now on are stamped
-- by their insert (key_in_line); these were enqueued before. An enqueue whose
-- transaction read the policy before it changed and commits after this statement stays
-- out of the line (docs/architecture.md, "Strict order per key").
UPDATE runs SET in_line = true
WHERE runs.lane = %(lane)s::text
  AND runs.lane <> 'fast_lane'
  AND runs.state IN ('scheduled', 'available', 'pending')
  AND runs.in_line IS NOT TRUE
  AND (runs.key = %(key)s::text
       OR (%(key)s::text = '*' AND NOT EXISTS (
           SELECT 1 FROM key_policies own
           WHERE own.lane = runs.lane AND own.key = runs.key AND own.ordered IS NOT NULL)))
RETURNING id
