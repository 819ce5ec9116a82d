-- renew: one renewal. ?1 … ?6 are the attempt id, its lease generation,
-- the worker token hash (hex), the job id, the TTL and now (Unix
-- nanoseconds). SQLite's batch is the single writer's transaction, which
-- gathers concurrent renewals, each this statement: so it takes one item,
-- with plain parameters (a JSON batch cost the single writer half its
-- renewals a second). The item's attempt gets its row back when its token
-- is its attempt's and job's, renewed when the fence holds (the lease to
-- now + TTL) and as it was otherwise, so that verdict words the refusal
-- from what this statement saw; now is the item's own (0 here).
UPDATE attempts SET
	lease_ttl = CASE WHEN /* guard.sql */ THEN r.ttl ELSE attempts.lease_ttl END,
	lease_expires_at = CASE WHEN /* guard.sql */ THEN r.now + r.ttl ELSE attempts.lease_expires_at END
FROM (SELECT ?1 AS id, ?2 AS gen, ?3 AS hash, ?4 AS job, ?5 AS ttl, ?6 AS now) AS r
WHERE attempts.id = r.id AND attempts.token_hash = r.hash AND attempts.job_id = r.job
RETURNING id, 0, generation, state, lease_ttl, lease_expires_at,
	(SELECT cancel_requested FROM jobs WHERE jobs.id = attempts.job_id)
