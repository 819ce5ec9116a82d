-- User tokens of the user API and the admin pages, shared by every
-- replica. Only a token's SHA-256 (hex) is kept; a revoked token keeps its
-- row, so that it is never accepted (or registered) again.

CREATE TABLE user_tokens (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	token_hash TEXT NOT NULL UNIQUE,
	created_at BIGINT NOT NULL,
	revoked_at BIGINT
);
