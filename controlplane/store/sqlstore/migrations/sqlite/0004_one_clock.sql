-- K3: the control plane's absence is the database's record. Every sweep
-- writes last_seen on the store's one clock and the gap it counts as an
-- absence; a guarded write accepts a lease that expired after last_seen
-- while last_seen is older than max_gap (an absence no sweep has resumed).
ALTER TABLE control_plane ADD COLUMN max_gap INTEGER NOT NULL DEFAULT 0;

-- Events are numbered per job (n, from 1) under a lock on the job's row
-- of job_event_counts, held to commit: a job's events commit in the order
-- of their numbers, so a follower paging by number never passes one that
-- commits late. A row of its own, not the job's, so that a claim's SKIP
-- LOCKED never passes over a queued job because an event is being written.
CREATE TABLE job_event_counts (
	job_id TEXT PRIMARY KEY,
	last   INTEGER NOT NULL
);
ALTER TABLE job_events ADD COLUMN n INTEGER NOT NULL DEFAULT 0;
UPDATE job_events SET n = r.n
FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY job_id ORDER BY id) AS n FROM job_events) AS r
WHERE r.id = job_events.id;
INSERT INTO job_event_counts (job_id, last) SELECT job_id, MAX(n) FROM job_events GROUP BY job_id;
DROP INDEX job_events_job;
CREATE UNIQUE INDEX job_events_job_n ON job_events (job_id, n);
