-- Times are Unix nanoseconds (BIGINT); flags are 0/1.

CREATE TABLE hosts (
	id                       TEXT PRIMARY KEY,
	name                     TEXT NOT NULL UNIQUE,
	token_hash               TEXT NOT NULL UNIQUE,
	created_at               BIGINT NOT NULL,
	last_heartbeat           BIGINT,
	capacity                 BIGINT NOT NULL DEFAULT 0,
	draining                 BIGINT NOT NULL DEFAULT 0,
	launch_error_class       TEXT NOT NULL DEFAULT '',
	launch_error_consecutive BIGINT NOT NULL DEFAULT 0,
	launch_error_since       BIGINT NOT NULL DEFAULT 0,
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
	epoch             BIGINT NOT NULL DEFAULT 0,
	native_turn       BIGINT NOT NULL DEFAULT 0,
	snapshot_id       TEXT NOT NULL DEFAULT '',
	next_seq          BIGINT NOT NULL DEFAULT 0,
	created_at        BIGINT NOT NULL,
	updated_at        BIGINT NOT NULL
);
CREATE INDEX conversations_created ON conversations (created_at, id);

-- pos is the queue order. head = 1 marks the one job of its conversation
-- that may run next (the oldest unfinished one), so that the claim query is
-- an ordered walk of jobs_claim with no per-conversation check.
CREATE TABLE jobs (
	pos                 BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id                  TEXT NOT NULL UNIQUE,
	conversation_id     TEXT NOT NULL REFERENCES conversations (id),
	seq                 BIGINT NOT NULL,
	prompt              TEXT NOT NULL,
	state               TEXT NOT NULL,
	head                BIGINT NOT NULL DEFAULT 0,
	outcome             TEXT NOT NULL DEFAULT '',
	reason              TEXT NOT NULL DEFAULT '',
	cancel_requested    BIGINT NOT NULL DEFAULT 0,
	generation          BIGINT NOT NULL DEFAULT 0,
	attempt_count       BIGINT NOT NULL DEFAULT 0,
	worker_lost_count   BIGINT NOT NULL DEFAULT 0,
	live_attempt_id     TEXT,
	admitted_attempt_id TEXT,
	created_at          BIGINT NOT NULL,
	ended_at            BIGINT,
	UNIQUE (conversation_id, seq)
);
CREATE INDEX jobs_claim ON jobs (pos) WHERE state = 'queued' AND head = 1;

CREATE TABLE attempts (
	id                   TEXT PRIMARY KEY,
	job_id               TEXT NOT NULL REFERENCES jobs (id),
	generation           BIGINT NOT NULL,
	state                TEXT NOT NULL,
	host_id              TEXT NOT NULL,
	lease_owner          TEXT NOT NULL,
	lease_ttl            BIGINT NOT NULL,
	lease_expires_at     BIGINT NOT NULL,
	claimed_at           BIGINT NOT NULL,
	ended_at             BIGINT,
	outcome              TEXT NOT NULL DEFAULT '',
	token_hash           TEXT NOT NULL UNIQUE,
	counts_as_attempt    BIGINT NOT NULL DEFAULT 1,
	container_backend    TEXT NOT NULL DEFAULT '',
	container_id         TEXT NOT NULL DEFAULT '',
	activation_id        TEXT,
	receipt_id           TEXT,
	admitted_at          BIGINT,
	snapshot_id          TEXT,
	settled_at           BIGINT,
	boundary_epoch       BIGINT NOT NULL DEFAULT 0,
	boundary_native_turn BIGINT NOT NULL DEFAULT 0,
	noticed_at           BIGINT,
	report               TEXT NOT NULL DEFAULT '',
	response             TEXT NOT NULL DEFAULT '',
	UNIQUE (job_id, generation)
);
-- One live attempt per job, enforced by the database.
CREATE UNIQUE INDEX attempts_live ON attempts (job_id) WHERE state = 'running';
CREATE INDEX attempts_expiry ON attempts (lease_expires_at) WHERE state = 'running';
CREATE INDEX attempts_host ON attempts (host_id) WHERE state = 'running';

CREATE TABLE job_events (
	id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	job_id     TEXT NOT NULL,
	attempt_id TEXT NOT NULL DEFAULT '',
	seq        BIGINT,
	time       BIGINT NOT NULL,
	source     TEXT NOT NULL,
	type       TEXT NOT NULL,
	data       TEXT NOT NULL DEFAULT ''
);
CREATE INDEX job_events_job ON job_events (job_id, id);
CREATE UNIQUE INDEX job_events_runner_seq ON job_events (attempt_id, seq) WHERE seq IS NOT NULL;

CREATE TABLE control_plane (
	id        BIGINT PRIMARY KEY CHECK (id = 1),
	last_seen BIGINT NOT NULL
);
