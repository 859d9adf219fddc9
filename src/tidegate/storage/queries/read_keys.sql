-- The busiest keys of the lanes: each key's policy (its own, else its lane's default
-- '*', field by field, as the claim reads it), its runs in flight and waiting, and what
-- holds it back. Independent of who asks: %(project)s NULL reads every project's runs;
-- a project reads its own runs only, and only the keys they use (a key policy belongs
-- to no project: a project sees the policies of its keys and of their lanes' '*').
--
-- Which keys, so the cost never follows the number of keys (a million tenants) or of
-- runs: those with runs in flight (runs_running: a few per worker slot), those of the
-- ready runs at the head of each lane (runs_claim_lane, %(scan_limit)s in all, shared
-- evenly by the lanes with a ready run: the keys next in line), and, for the super admin, those with a policy of their own (at most
-- %(limit)s). Of those, the lanes' defaults and then the busiest (most in flight, then
-- most runs next in line) are kept, %(limit)s in all, and only they have their waiting
-- runs counted (runs_key_ready, up to %(waiting_cap)s each). A key deep in a backlog
-- behind the head is not listed.
--
-- held_by: 'breaker' when the key's circuit breaker is open (or forced open); 'order'
-- (below); 'cap' when the key's runs in flight (of every project: that is what the
-- claim counts) reach max_running; 'rate' when its GCRA state (key_rates.tat) is further
-- ahead than the burst allows, which is the claim's own test; else ''. fast_lane runs
-- are exempt from key limits, so only a breaker holds a fast_lane key. breaker: the
-- breaker's state (functions/breaker_state.sql) where the key has a row, with
-- open_until; the super admin also sees the keys whose breakers are open or forced.
-- ordered: the key's policy (its own, else its lane's default) keeps its runs in strict
-- order (never in fast_lane); head, head_state: the run at the front of its line, the one
-- its other runs wait behind (functions/line_front.sql: two index probes), its id shown
-- only to whom the run's project is visible; held_by 'order' when runs wait behind it.
WITH running AS (
    SELECT lane, key, count(*) AS every_project,
           count(*) FILTER (WHERE %(project)s::text IS NULL OR project = %(project)s) AS own
    FROM runs WHERE state = 'running'
    GROUP BY lane, key
),
lanes AS MATERIALIZED (
    SELECT lane FROM ready_lanes('{}')
),
head AS (
    SELECT ready.lane, ready.key, count(*) AS next_in_line
    FROM lanes
    CROSS JOIN LATERAL (
        SELECT runs.lane, runs.key, runs.project FROM runs
        WHERE runs.lane = lanes.lane AND runs.state = 'available'
        ORDER BY runs.rank, runs.id
        LIMIT ceil(%(scan_limit)s::integer / (SELECT count(*) FROM lanes)::float8)::integer
    ) AS ready
    WHERE %(project)s::text IS NULL OR ready.project = %(project)s
    GROUP BY ready.lane, ready.key
),
keys AS (
    SELECT lane, key FROM running WHERE own > 0
    UNION
    SELECT lane, key FROM head
    UNION
    SELECT policed.lane, policed.key FROM (
        SELECT lane, key FROM key_policies
        WHERE %(project)s::text IS NULL
        ORDER BY lane, key
        LIMIT %(limit)s::integer
    ) AS policed
    UNION
    SELECT tripped.lane, tripped.key FROM (
        SELECT lane, key FROM key_breakers
        WHERE %(project)s::text IS NULL AND (state = 'open' OR forced IS NOT NULL)
        ORDER BY lane, key
        LIMIT %(limit)s::integer
    ) AS tripped
),
chosen AS (
    SELECT candidates.lane, candidates.key FROM (
        SELECT lane, key FROM keys
        UNION
        SELECT lane_default.lane, lane_default.key FROM key_policies AS lane_default
        WHERE lane_default.key = '*' AND lane_default.lane IN (SELECT lane FROM keys)
    ) AS candidates
    LEFT JOIN running USING (lane, key)
    LEFT JOIN head USING (lane, key)
    LEFT JOIN key_breakers AS b USING (lane, key)
    ORDER BY candidates.key <> '*', (b.state = 'open' OR b.forced = 'open') IS NOT TRUE,
             coalesce(running.own, 0) DESC,
             coalesce(head.next_in_line, 0) DESC, candidates.lane, candidates.key
    LIMIT %(limit)s::integer
),
figures AS (
    SELECT c.lane, c.key,
           coalesce(own.max_running, lane_default.max_running) AS max_running,
           coalesce(own.weight, lane_default.weight, 1.0) AS weight,
           coalesce(own.rate, lane_default.rate) AS rate,
           coalesce(own.rate_burst, lane_default.rate_burst, 1) AS rate_burst,
           CASE WHEN c.key <> '*' THEN coalesce(running.own, 0) END AS in_flight,
           CASE WHEN c.key <> '*' THEN (
               SELECT count(*) FILTER (
                   WHERE %(project)s::text IS NULL OR waiting.project = %(project)s)
               FROM (
                   SELECT project FROM runs
                   WHERE runs.lane = c.lane AND runs.key = c.key AND runs.state = 'available'
                   LIMIT %(waiting_cap)s::integer
               ) AS waiting
           ) END AS waiting,
           coalesce(running.every_project, 0) AS gate_in_flight,
           (SELECT tat FROM key_rates WHERE key_rates.lane = c.lane AND key_rates.key = c.key)
               AS tat,
           CASE WHEN b.lane IS NOT NULL THEN breaker_state(b) END AS breaker,
           b.open_until AS breaker_until,
           coalesce(own.ordered, lane_default.ordered, false) AND c.lane <> 'fast_lane'
               AS ordered,
           CASE WHEN %(project)s::text IS NULL OR front.project = %(project)s
                THEN front.id END AS head,
           front.state::text AS head_state
    FROM chosen AS c
    LEFT JOIN key_breakers AS b ON b.lane = c.lane AND b.key = c.key
    LEFT JOIN key_policies AS own ON own.lane = c.lane AND own.key = c.key
    LEFT JOIN key_policies AS lane_default
        ON lane_default.lane = c.lane AND lane_default.key = '*'
    LEFT JOIN running ON running.lane = c.lane AND running.key = c.key
    LEFT JOIN LATERAL (
        SELECT line.id, line.state, line.project FROM line_front(c.lane, c.key) AS line
        WHERE c.key <> '*' AND c.lane <> 'fast_lane'
          AND coalesce(own.ordered, lane_default.ordered, false)
    ) AS front ON true
)
SELECT lane, key, max_running, weight, rate, rate_burst, in_flight, waiting,
       CASE
           WHEN breaker IN ('open', 'forced_open') THEN 'breaker'
           WHEN key = '*' OR lane = 'fast_lane' THEN ''
           WHEN ordered AND head_state <> 'available' AND waiting > 0 THEN 'order'
           WHEN max_running IS NOT NULL AND gate_in_flight >= max_running THEN 'cap'
           WHEN rate IS NOT NULL
                AND tat > now() + make_interval(secs => (rate_burst - 1) / rate) THEN 'rate'
           ELSE ''
       END AS held_by,
       breaker, breaker_until, ordered, head, head_state
FROM figures
ORDER BY key <> '*', in_flight DESC, waiting DESC, lane, key
