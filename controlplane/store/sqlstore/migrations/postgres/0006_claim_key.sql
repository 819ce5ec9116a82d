-- Claim idempotency (issue 11 §11): a claim may carry a key chosen by the
-- host; claim_key is its hash (hex). The same key again, from the same
-- host, while the attempt is running and its lease not expired, gets the
-- same attempt back instead of a second one, so an answer lost on the way
-- costs nothing. claim_held is the long poll's hold of the first answer
-- (ns, K4), repeated with it. One running attempt per host and key (claims
-- with one key take turns on PostgreSQL under an advisory lock).
ALTER TABLE attempts ADD COLUMN claim_key TEXT;
ALTER TABLE attempts ADD COLUMN claim_held BIGINT NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX attempts_claim_key ON attempts (host_id, claim_key) WHERE state = 'running' AND claim_key IS NOT NULL;
