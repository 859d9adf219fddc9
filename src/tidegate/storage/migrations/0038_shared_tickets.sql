-- A caller's one ticket may name a place in several lines: a place of the ingest rate's
-- line that came due is kept beside the places caps' lines then give it, under the same
-- ticket (admit_webhook), so the rate's reservation is not spent again.
DROP INDEX waiting_places_ticket;
CREATE UNIQUE INDEX waiting_places_ticket ON waiting_places (ticket, waits_for, key);
