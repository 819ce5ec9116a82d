-- Host lifecycle without database access (issue 13 §3). paused_at: an
-- operator paused the host; it claims nothing until resumed, its running
-- turns go on. removed_at: the host was removed; its token was replaced by
-- a tombstone in the same statement, so it is refused from then on; the
-- row stays for the attempts that name it. heartbeat_interval_ms is the
-- period the host says it heartbeats at, from which it is shown offline;
-- claims_withheld is the class of the reason the host itself gives for
-- not claiming (its sandbox backend is unreachable), '' when it claims.

ALTER TABLE hosts ADD COLUMN paused_at INTEGER;
ALTER TABLE hosts ADD COLUMN removed_at INTEGER;
ALTER TABLE hosts ADD COLUMN heartbeat_interval_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN claims_withheld TEXT NOT NULL DEFAULT '';
