-- The claim long poll's wake-up (issue 14 §3): a job that becomes a queued
-- head of its conversation — enqueued, released, requeued, its
-- conversation's previous turn ended — or a host resumed or its labels
-- changed (routing) notifies runnerd_work, at commit, every replica
-- listening on the database. The payload is the schema, so that stores in
-- other schemas of one database (the tests') do not wake each other.
-- PostgreSQL folds the same notification of one transaction into one.
CREATE FUNCTION runnerd_work_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('runnerd_work', current_schema());
	RETURN NULL;
END
$$;
CREATE TRIGGER jobs_work_inserted AFTER INSERT ON jobs
	FOR EACH ROW WHEN (NEW.state = 'queued' AND NEW.head = 1) EXECUTE FUNCTION runnerd_work_notify();
CREATE TRIGGER jobs_work_updated AFTER UPDATE OF state, head ON jobs
	FOR EACH ROW WHEN (NEW.state = 'queued' AND NEW.head = 1) EXECUTE FUNCTION runnerd_work_notify();
CREATE TRIGGER hosts_work_changed AFTER UPDATE OF paused_at, labels ON hosts
	FOR EACH ROW WHEN ((OLD.paused_at IS NOT NULL AND NEW.paused_at IS NULL) OR OLD.labels <> NEW.labels)
	EXECUTE FUNCTION runnerd_work_notify();
