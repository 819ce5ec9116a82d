-- Routing (issue 13 §1). A conversation's requirements are a canonical
-- label set, "key=value,key=value" sorted by key ('' requires nothing);
-- each distinct set is one row of routes, its labels one row each of
-- route_labels. A job carries its conversation's route, so the claim walks
-- jobs_claim_any once per route the host meets, in queue order, and never
-- reads the turns of a route it does not meet. Routes are few (distinct
-- requirement sets, not turns), so reading them all on a claim is bounded.
-- unroutable is the reaper's last verdict: NULL while some live host meets
-- the route; else the labels the closest live host lacks ('' when there is
-- no live host at all), since unroutable_since.

CREATE TABLE routes (
	labels           TEXT PRIMARY KEY,
	unroutable       TEXT,
	unroutable_since BIGINT NOT NULL DEFAULT 0
);
INSERT INTO routes (labels) VALUES ('');

CREATE TABLE route_labels (
	route TEXT NOT NULL REFERENCES routes (labels),
	key   TEXT NOT NULL,
	value TEXT NOT NULL,
	PRIMARY KEY (route, key)
);

-- What the host said in its last heartbeat: hosts.labels canonical, and
-- one row per label for the claim's match.
ALTER TABLE hosts ADD COLUMN labels TEXT NOT NULL DEFAULT '';
CREATE TABLE host_labels (
	host_id TEXT NOT NULL REFERENCES hosts (id),
	key     TEXT NOT NULL,
	value   TEXT NOT NULL,
	PRIMARY KEY (host_id, key)
);

ALTER TABLE conversations ADD COLUMN requires TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN route TEXT NOT NULL DEFAULT '';

DROP INDEX jobs_claim_any;
CREATE INDEX jobs_claim_any ON jobs (route, pos) WHERE state = 'queued' AND head = 1 AND sandbox_host_id IS NULL;
