-- Times are Unix nanoseconds (INTEGER); flags are 0/1.

CREATE TABLE hosts (
	id                       TEXT PRIMARY KEY,
	name                     TEXT NOT NULL UNIQUE,
	token_hash               TEXT NOT NULL UNIQUE,
	created_at               INTEGER NOT NULL,
	last_heartbeat           INTEGER,
	capacity                 INTEGER NOT NULL DEFAULT 0,
	draining                 INTEGER NOT NULL DEFAULT 0,
	launch_error_class       TEXT NOT NULL DEFAULT '',
	launch_error_consecutive INTEGER NOT NULL DEFAULT 0,
	launch_error_since       INTEGER NOT NULL DEFAULT 0,
	version                  TEXT NOT NULL DEFAULT ''
);

CREATE TABLE conversations (
	id                TEXT PRIMARY KEY,
	title             TEXT NOT NULL DEFAULT '',
	image             TEXT NOT NULL DEFAULT '',
	agent_command     TEXT NOT NULL,
	state             TEXT NOT NULL,
	lost_reason       TEXT NOT NULL DEFAULT '',
	container_backend TEXT NOT NULL DEFAULT '',
	container_id      TEXT NOT NULL DEFAULT '',
	epoch             INTEGER NOT NULL DEFAULT 0,
	native_turn       INTEGER NOT NULL DEFAULT 0,
	snapshot_id       TEXT NOT NULL DEFAULT '',
	next_seq          INTEGER NOT NULL DEFAULT 0,
	created_at        INTEGER NOT NULL,
	updated_at        INTEGER NOT NULL
);
CREATE INDEX conversations_created ON conversations (created_at, id);

-- pos is the queue order. head = 1 marks the one job of its conversation
-- that may run next (the oldest unfinished one), so that the claim query is
-- an ordered walk of jobs_claim with no per-conversation check.
CREATE TABLE jobs (
	pos                 INTEGER PRIMARY KEY,
	id                  TEXT NOT NULL UNIQUE,
	conversation_id     TEXT NOT NULL REFERENCES conversations (id),
	seq                 INTEGER NOT NULL,
	prompt              TEXT NOT NULL,
	state               TEXT NOT NULL,
	head                INTEGER NOT NULL DEFAULT 0,
	outcome             TEXT NOT NULL DEFAULT '',
	reason              TEXT NOT NULL DEFAULT '',
	cancel_requested    INTEGER NOT NULL DEFAULT 0,
	generation          INTEGER NOT NULL DEFAULT 0,
	attempt_count       INTEGER NOT NULL DEFAULT 0,
	worker_lost_count   INTEGER NOT NULL DEFAULT 0,
	live_attempt_id     TEXT,
	admitted_attempt_id TEXT,
	created_at          INTEGER NOT NULL,
	ended_at            INTEGER,
	UNIQUE (conversation_id, seq)
);
CREATE INDEX jobs_claim ON jobs (pos) WHERE state = 'queued' AND head = 1;

CREATE TABLE attempts (
	id                   TEXT PRIMARY KEY,
	job_id               TEXT NOT NULL REFERENCES jobs (id),
	generation           INTEGER NOT NULL,
	state                TEXT NOT NULL,
	host_id              TEXT NOT NULL,
	lease_owner          TEXT NOT NULL,
	lease_ttl            INTEGER NOT NULL,
	lease_expires_at     INTEGER NOT NULL,
	claimed_at           INTEGER NOT NULL,
	ended_at             INTEGER,
	outcome              TEXT NOT NULL DEFAULT '',
	token_hash           TEXT NOT NULL UNIQUE,
	counts_as_attempt    INTEGER NOT NULL DEFAULT 1,
	container_backend    TEXT NOT NULL DEFAULT '',
	container_id         TEXT NOT NULL DEFAULT '',
	activation_id        TEXT,
	receipt_id           TEXT,
	admitted_at          INTEGER,
	snapshot_id          TEXT,
	settled_at           INTEGER,
	boundary_epoch       INTEGER NOT NULL DEFAULT 0,
	boundary_native_turn INTEGER NOT NULL DEFAULT 0,
	noticed_at           INTEGER,
	report               TEXT NOT NULL DEFAULT '',
	response             TEXT NOT NULL DEFAULT '',
	UNIQUE (job_id, generation)
);
-- One live attempt per job, enforced by the database.
CREATE UNIQUE INDEX attempts_live ON attempts (job_id) WHERE state = 'running';
CREATE INDEX attempts_expiry ON attempts (lease_expires_at) WHERE state = 'running';
CREATE INDEX attempts_host ON attempts (host_id) WHERE state = 'running';

CREATE TABLE job_events (
	id         INTEGER PRIMARY KEY,
	job_id     TEXT NOT NULL,
	attempt_id TEXT NOT NULL DEFAULT '',
	seq        INTEGER,
	time       INTEGER NOT NULL,
	source     TEXT NOT NULL,
	type       TEXT NOT NULL,
	data       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX job_events_job ON job_events (job_id, id);
CREATE UNIQUE INDEX job_events_runner_seq ON job_events (attempt_id, seq) WHERE seq IS NOT NULL;

CREATE TABLE control_plane (
	id        INTEGER PRIMARY KEY CHECK (id = 1),
	last_seen INTEGER NOT NULL
);
