-- Interrupted is not lost (K13). A conversation whose admitted turn ended
-- without a recorded settlement is 'quarantined' (a new value of
-- conversations.state, beside 'usable' and 'lost'): interrupted_job_id
-- names that turn until the next turn's activation verified the retained
-- container and the native turn boundary and recorded it ('' otherwise).
ALTER TABLE conversations ADD COLUMN interrupted_job_id TEXT NOT NULL DEFAULT '';
