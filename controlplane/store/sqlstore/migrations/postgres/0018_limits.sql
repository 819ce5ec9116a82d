-- A conversation's resource limits (wire.Limits: cpus, memory_bytes, pids),
-- as JSON, fixed at its creation; '' for none (every conversation before
-- this one).
ALTER TABLE conversations ADD COLUMN limits TEXT NOT NULL DEFAULT '';
