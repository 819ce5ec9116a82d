package sqlstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// maxRenewBatch bounds the renewals of one coalesced statement.
const maxRenewBatch = 1024

// PostgreSQL's renewals coalesce (s.rb): every renewal queued while a
// statement runs goes into the next one, a single UPDATE … FROM unnest(…)
// in which each renewal is fenced on its own row (its token's hash, job,
// attempt, generation and live lease, at its own now or the database's
// clock) and answered on its own: a renewal the statement did not return
// takes RenewAs's ordinary path, which words its refusal.
type renewBatcher = coalescer[renewReq, renewAnswer]

func (s *Store) newRenewBatcher() *renewBatcher { return newCoalescer(1, maxRenewBatch, s.renewBatch) }

// renewReq is one caller's renewal.
type renewReq struct {
	w   store.Worker
	ref wire.AttemptRef
	ttl time.Duration
	now any // nil: the database's clock
}

type renewAnswer struct {
	resp wire.RenewResponse
	ok   bool // renewed; false: the ordinary path decides
	err  error
}

// renewCoalesced queues one renewal and returns its answer.
func (s *Store) renewCoalesced(ctx context.Context, w store.Worker, ref wire.AttemptRef, ttl time.Duration, now any) renewAnswer {
	a, err := s.rb.do(ctx, renewReq{w: w, ref: ref, ttl: ttl, now: now})
	if err != nil {
		return renewAnswer{err: err}
	}
	return a
}

// coalescedRenewal is the statement of one batch: $1 … $7 the renewals'
// attempt ids, generations, token hashes (hex), job ids, TTLs, nows (0:
// the database's clock) and their index in the batch.
var coalescedRenewal = `WITH clock AS (SELECT ` + dbNow + ` AS t), r AS (
	SELECT r.id, r.gen, r.hash, r.job, r.ttl, COALESCE(NULLIF(r.now, 0), (SELECT t FROM clock)) AS now, r.k
	FROM unnest(CAST($1 AS TEXT[]), CAST($2 AS BIGINT[]), CAST($3 AS TEXT[]), CAST($4 AS TEXT[]),
		CAST($5 AS BIGINT[]), CAST($6 AS BIGINT[]), CAST($7 AS BIGINT[])) AS r(id, gen, hash, job, ttl, now, k)
)
UPDATE attempts SET lease_ttl = r.ttl, lease_expires_at = r.now + r.ttl
FROM r
WHERE ` + unnestGuard(`r.now`) + `
RETURNING r.k, attempts.lease_expires_at, (SELECT cancel_requested FROM jobs WHERE jobs.id = attempts.job_id)`

// renewBatch runs one batch of renewals in one statement and returns
// each one's answer.
func (s *Store) renewBatch(batch []renewReq) []renewAnswer {
	n := len(batch)
	ids, hashes, jobs := make([]string, n), make([]string, n), make([]string, n)
	gens, ttls, nows, ks := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, r := range batch {
		ids[i], gens[i], hashes[i], jobs[i] = r.ref.AttemptID, r.ref.LeaseGeneration, hex.EncodeToString(r.w.TokenHash), r.w.JobID
		ttls[i], ks[i] = int64(r.ttl), int64(i)
		if r.now != nil {
			nows[i] = r.now.(int64)
		}
	}
	var answers []renewAnswer
	var err error
	// The statement locks its rows in the order of its join: against
	// another statement locking many (ResumeAfterAbsence) PostgreSQL may
	// end one of them as a deadlock, after which it simply runs again.
	for try := 0; try == 0 || (err != nil && s.retryable(err) && try < 8); try++ {
		answers = make([]renewAnswer, n)
		err = s.one(context.Background(), func(tx txn) error {
			s.rb.statements.Add(1)
			rows, err := tx.QueryContext(context.Background(), coalescedRenewal, ids, gens, hashes, jobs, ttls, nows, ks)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var k, exp, cancel int64
				if err := rows.Scan(&k, &exp, &cancel); err != nil {
					return err
				}
				if k < 0 || k >= int64(n) {
					return fmt.Errorf("renewal %d of a batch of %d", k, n)
				}
				answers[k] = renewAnswer{ok: true, resp: wire.RenewResponse{LeaseExpiresAt: fromNS(exp),
					LeaseTTLMS: batch[k].ttl.Milliseconds(), CancelRequested: cancel != 0}}
			}
			return rows.Err()
		})
	}
	if err != nil {
		for i := range answers {
			answers[i] = renewAnswer{err: err}
		}
		return answers
	}
	for _, a := range answers {
		if a.ok {
			s.rb.answered.Add(1)
		}
	}
	return answers
}
