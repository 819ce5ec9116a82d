-- Two daemons presenting one host token (issue 22 §1). instance_id is the
-- daemon instance whose heartbeats hold the token (random per process
-- start), instance_boot_id its machine's kernel boot id, instance_seen its
-- last heartbeat, instance_stopping 1 once its last heartbeat said it
-- stops. conflict_*: the last other instance refused 409
-- host_token_in_use, and when. '' / NULL: none named itself.

ALTER TABLE hosts ADD COLUMN instance_id TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN instance_boot_id TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN instance_seen BIGINT;
ALTER TABLE hosts ADD COLUMN instance_stopping INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN conflict_instance_id TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN conflict_boot_id TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN conflict_seen BIGINT;
