-- Workers claim only runs of tasks they have (docs/architecture.md, invariant 9).
--
-- A worker advertises its tasks in its row. A claim skips the runs of tasks the claimer
-- lacks; those no live worker has go to 'pending' (0006), out of the claim's indexes,
-- and a worker that has the task makes them available again (stage_runs). So a run of a
-- task nobody has spends no attempt, and a backlog of them costs a claim a bounded scan
-- once, not at every claim. The claim, the parker and admission changed here; see
-- functions/.

ALTER TABLE workers ADD COLUMN tasks text[] NOT NULL DEFAULT '{}';

-- The stager of a worker that has a task: its pending runs.
CREATE INDEX runs_pending ON runs (task) WHERE state = 'pending';

-- Idempotency keys are scoped per trigger (admit_webhook).
DROP INDEX requests_idempotency;
CREATE UNIQUE INDEX requests_idempotency ON requests (trigger_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The fast-lane cap counts pending runs too: they are in flight until they finish.
DROP INDEX runs_fast_lane_inflight;
CREATE INDEX runs_fast_lane_inflight ON runs (project)
    WHERE lane = 'fast_lane' AND state IN ('scheduled', 'available', 'pending', 'running');

-- The bounds of rates and weights (tidegate.limits), held by the database too: 1/rate
-- and 1/weight become intervals and clock steps in every claim, and a value past them
-- (a rate of 1e-20 overflows make_interval) would fail every claim of its lane. Values
-- stored before the bounds existed are brought inside them first.
UPDATE key_policies SET
    rate = least(greatest(rate, 0.001), 1000000),
    weight = least(greatest(weight, 0.001), 1000)
WHERE rate NOT BETWEEN 0.001 AND 1000000 OR weight NOT BETWEEN 0.001 AND 1000;
ALTER TABLE key_policies
    DROP CONSTRAINT key_policies_rate_range,
    DROP CONSTRAINT key_policies_weight_range,
    ADD CONSTRAINT key_policies_rate_range CHECK (rate BETWEEN 0.001 AND 1000000),
    ADD CONSTRAINT key_policies_weight_range CHECK (weight BETWEEN 0.001 AND 1000);
UPDATE projects SET ingest_rate = least(greatest(ingest_rate, 0.001), 1000000)
WHERE ingest_rate NOT BETWEEN 0.001 AND 1000000;
ALTER TABLE projects
    DROP CONSTRAINT projects_ingest_rate_range,
    ADD CONSTRAINT projects_ingest_rate_range CHECK (ingest_rate BETWEEN 0.001 AND 1000000);
