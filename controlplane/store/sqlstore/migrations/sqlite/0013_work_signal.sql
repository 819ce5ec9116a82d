-- The claim long poll's wake-up (issue 14 §3): a job that becomes a queued
-- head of its conversation — enqueued, released, requeued, its
-- conversation's previous turn ended — or a host resumed or its labels
-- changed (routing) bumps work_signal.n; the store's writer watches that
-- table's changes on its connection and wakes the waiting long polls
-- after the commit (sqliteWriter).
CREATE TABLE work_signal (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	n  INTEGER NOT NULL
);
INSERT INTO work_signal (id, n) VALUES (1, 0);
CREATE TRIGGER jobs_work_inserted AFTER INSERT ON jobs
	WHEN NEW.state = 'queued' AND NEW.head = 1
	BEGIN UPDATE work_signal SET n = n + 1; END;
CREATE TRIGGER jobs_work_updated AFTER UPDATE OF state, head ON jobs
	WHEN NEW.state = 'queued' AND NEW.head = 1
	BEGIN UPDATE work_signal SET n = n + 1; END;
CREATE TRIGGER hosts_work_changed AFTER UPDATE OF paused_at, labels ON hosts
	WHEN (OLD.paused_at IS NOT NULL AND NEW.paused_at IS NULL) OR OLD.labels <> NEW.labels
	BEGIN UPDATE work_signal SET n = n + 1; END;
