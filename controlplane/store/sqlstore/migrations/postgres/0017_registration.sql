-- Self-registration and token rotation with a grace (issue 22 §1, §2).
--
-- registration_tokens: a token a daemon presents once to register itself
-- (POST /v1/agent/register) and get its own host token. Only its SHA-256
-- (hex) is kept. labels: the operator labels (name=value, comma-joined,
-- sorted) a host registering with it may carry; '' grants none. max_uses:
-- 0 is no limit; uses counts the hosts it registered. expires_at: NULL
-- never. A revoked token keeps its row; the hosts it registered keep
-- their own tokens.
--
-- A rotation with a grace (rotate-token --grace): the host's token hash
-- moves to previous_token_hash, valid until previous_token_until; its new
-- token is HMAC-SHA256 of rotation_nonce keyed by the previous token, so
-- only a holder of that token can derive it: the heartbeat answer to the
-- previous token hands it over, and the database alone reveals nothing.
-- Until the host picks it up, token_hash is a placeholder no hash equals
-- ('rotating:' || id). registered_by: the registration token's id, ''
-- for a host added by hand.

CREATE TABLE registration_tokens (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL,
	token_hash TEXT NOT NULL UNIQUE,
	labels     TEXT NOT NULL DEFAULT '',
	max_uses   BIGINT NOT NULL DEFAULT 0,
	uses       BIGINT NOT NULL DEFAULT 0,
	expires_at BIGINT,
	created_at BIGINT NOT NULL,
	revoked_at BIGINT
);

ALTER TABLE hosts ADD COLUMN previous_token_hash TEXT;
ALTER TABLE hosts ADD COLUMN previous_token_until BIGINT;
ALTER TABLE hosts ADD COLUMN rotation_nonce TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN registered_by TEXT NOT NULL DEFAULT '';

-- A host token is looked up by either hash.
CREATE INDEX hosts_previous_token_hash ON hosts (previous_token_hash);
