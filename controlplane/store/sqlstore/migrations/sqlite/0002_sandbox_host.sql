-- Host affinity: a conversation's retained sandbox (container and
-- workspace) lives on the host whose attempt last recorded it, so its
-- turns may run only there. NULL means no sandbox yet: any host.
-- jobs.sandbox_host_id copies the conversation's for its unfinished turns.
-- Claim reads two ordered ranges: the turns any host may take
-- (jobs_claim_any) and those pinned to the claiming host (jobs_claim_host),
-- so turns pinned to other hosts are never read. Two partial indexes rather
-- than one on (sandbox_host_id, pos): PostgreSQL's planner otherwise walks
-- the primary key for the free range, filtering row by row. NULL rather
-- than '' for "any host": SQLite recompiles a statement on every run when a
-- bound value is compared with a constant in a partial index's WHERE.

ALTER TABLE conversations ADD COLUMN sandbox_host_id TEXT;
ALTER TABLE jobs ADD COLUMN sandbox_host_id TEXT;

UPDATE conversations SET sandbox_host_id = (
	SELECT a.host_id FROM attempts a JOIN jobs j ON j.id = a.job_id
	WHERE j.conversation_id = conversations.id AND a.container_id <> ''
	ORDER BY j.seq DESC, a.generation DESC LIMIT 1)
WHERE container_id <> '';

UPDATE jobs SET sandbox_host_id = (SELECT c.sandbox_host_id FROM conversations c WHERE c.id = jobs.conversation_id)
WHERE state IN ('queued', 'running');

DROP INDEX jobs_claim;
CREATE INDEX jobs_claim_any ON jobs (pos) WHERE state = 'queued' AND head = 1 AND sandbox_host_id IS NULL;
CREATE INDEX jobs_claim_host ON jobs (sandbox_host_id, pos) WHERE state = 'queued' AND head = 1 AND sandbox_host_id IS NOT NULL;
