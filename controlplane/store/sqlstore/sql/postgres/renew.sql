-- renew: a batch of renewals in one statement. $1 … $6 are the items'
-- attempt ids (unique in a batch), lease generations, worker token hashes
-- (hex), job ids, TTLs and nows (0: the database's clock, read here). Every item whose
-- token is its attempt's and job's gets the attempt's row back, renewed
-- when the fence holds (the lease to now + TTL) and as it was otherwise,
-- so that verdict words the refusal from what this statement saw.
UPDATE attempts SET
	lease_ttl = CASE WHEN /* guard.sql */ THEN r.ttl ELSE attempts.lease_ttl END,
	lease_expires_at = CASE WHEN /* guard.sql */ THEN r.now + r.ttl ELSE attempts.lease_expires_at END
FROM (
	SELECT i.id, i.gen, i.hash, i.job, i.ttl,
		COALESCE(NULLIF(i.now, 0), CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000000 AS BIGINT)) AS now
	FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[]), CAST($3 AS TEXT[]),
		CAST($4 AS TEXT[]), CAST($5 AS BIGINT[]), CAST($6 AS BIGINT[])) AS i(id, gen, hash, job, ttl, now)
) AS r
WHERE attempts.id = r.id AND attempts.token_hash = r.hash AND attempts.job_id = r.job
RETURNING attempts.id, r.now, attempts.generation, attempts.state, attempts.lease_ttl, attempts.lease_expires_at,
	(SELECT cancel_requested FROM jobs WHERE jobs.id = attempts.job_id)
