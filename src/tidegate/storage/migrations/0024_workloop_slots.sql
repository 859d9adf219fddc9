-- A workloop has 1 to 10,000 slots (tidegate.limits.MAX_SLOTS, checked where a spec is
-- parsed: registration, settings, the CLI). Admission reads each live workloop's slots
-- as an integer and sums them (admit_webhook): a worker that registered
-- `*:99999999999999999999` made every sync webhook for its tasks, and /metrics, fail
-- with an integer overflow (a 422) for as long as it heartbeated. Every reader of a
-- workers row may now take the bound for granted, whoever wrote the row.
--
-- A row written past it before this check is removed: a remote worker is refused (404)
-- at its next call and registers again, within the bound or not at all.
DELETE FROM workers
WHERE jsonb_path_exists(
    workloops,
    '$[*] ? (!exists(@.slots) || @.slots.type() != "number"
             || @.slots < 1 || @.slots > 10000 || @.slots != @.slots.floor())'
);

ALTER TABLE workers ADD CONSTRAINT workers_slots_bounded CHECK (
    NOT jsonb_path_exists(
        workloops,
        '$[*] ? (!exists(@.slots) || @.slots.type() != "number"
                 || @.slots < 1 || @.slots > 10000 || @.slots != @.slots.floor())'
    )
);
