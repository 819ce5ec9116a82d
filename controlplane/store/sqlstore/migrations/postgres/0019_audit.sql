-- The admin audit (issue 22 §6): one row per admin action, written in the
-- action's own transaction, so that neither exists without the other.
-- actor: the user token's name (never the token); action: wire.Audit*;
-- target: the host's name; reason: the operator's --reason, '' if none.
-- at: nanoseconds on the store's clock. id orders the rows (the cursor).

CREATE TABLE audit_log (
	id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	at     BIGINT NOT NULL,
	actor  TEXT NOT NULL,
	action TEXT NOT NULL,
	target TEXT NOT NULL,
	reason TEXT NOT NULL DEFAULT ''
);

CREATE INDEX audit_log_target ON audit_log (target, id);

-- Who paused a paused host and why, for Admin → Servers ('' when not paused).
ALTER TABLE hosts ADD COLUMN paused_by TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN pause_reason TEXT NOT NULL DEFAULT '';
