-- renew: a batch of renewals in one statement. ?1 is the batch as one JSON
-- array of items {k, id, gen, hash, job, ttl, now}: index, attempt id,
-- lease generation, worker token hash (hex), job id, TTL and now (Unix
-- nanoseconds). Every item whose token is its attempt's and job's gets the
-- attempt's row back, renewed when the fence holds (the lease to now + TTL)
-- and as it was otherwise, so that verdict words the refusal from what this
-- statement saw. SQLite's RETURNING names only the updated table, so the
-- item's index and now are found again by its attempt id (unique in a
-- batch).
UPDATE attempts SET
	lease_ttl = CASE WHEN /* guard.sql */ THEN r.ttl ELSE attempts.lease_ttl END,
	lease_expires_at = CASE WHEN /* guard.sql */ THEN r.now + r.ttl ELSE attempts.lease_expires_at END
FROM (
	SELECT json_extract(value, '$.k') AS k, json_extract(value, '$.id') AS id, json_extract(value, '$.gen') AS gen,
		json_extract(value, '$.hash') AS hash, json_extract(value, '$.job') AS job,
		json_extract(value, '$.ttl') AS ttl, json_extract(value, '$.now') AS now
	FROM json_each(?1)
) AS r
WHERE attempts.id = r.id AND attempts.token_hash = r.hash AND attempts.job_id = r.job
RETURNING (SELECT json_extract(value, '$.k') FROM json_each(?1) WHERE json_extract(value, '$.id') = attempts.id),
	(SELECT json_extract(value, '$.now') FROM json_each(?1) WHERE json_extract(value, '$.id') = attempts.id),
	generation, state, lease_ttl, lease_expires_at,
	(SELECT cancel_requested FROM jobs WHERE jobs.id = attempts.job_id)
