package sqlstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// maxRenewBatch bounds the renewals of one coalesced statement.
const maxRenewBatch = 1024

// renewBatcher coalesces PostgreSQL renewals, as sqliteWriter does
// SQLite's writes: every renewal queued while a statement runs goes into
// the next one, a single UPDATE … FROM unnest(…) in which each renewal is
// fenced on its own row (its token's hash, job, attempt, generation and
// live lease, at its own now or the database's clock) and answered on its
// own: a renewal the statement did not return takes RenewAs's ordinary
// path, which words its refusal. Whoever takes the turn leads, so the
// batcher has no goroutine of its own.
type renewBatcher struct {
	// turn is held by the leader of a batch. A channel, so that a waiter
	// inside a synctest bubble is durably blocked.
	turn chan struct{}

	mu    sync.Mutex  // guards queue
	queue []*renewReq // renewals waiting for a leader, oldest first

	statements atomic.Int64 // coalesced statements run, for the tests that count them
}

func newRenewBatcher() *renewBatcher { return &renewBatcher{turn: make(chan struct{}, 1)} }

// renewReq is one caller's renewal, waiting in the queue or in a batch.
type renewReq struct {
	w    store.Worker
	ref  wire.AttemptRef
	ttl  time.Duration
	now  any              // nil: the database's clock
	done chan renewAnswer // buffered; the answer, sent once
}

type renewAnswer struct {
	resp wire.RenewResponse
	ok   bool // renewed; false: the ordinary path decides
	err  error
}

// renew queues one renewal and returns its answer.
func (s *Store) renewCoalesced(ctx context.Context, w store.Worker, ref wire.AttemptRef, ttl time.Duration, now any) renewAnswer {
	b := s.rb
	req := &renewReq{w: w, ref: ref, ttl: ttl, now: now, done: make(chan renewAnswer, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, req)
	b.mu.Unlock()
	for {
		select {
		case a := <-req.done:
			return a
		case b.turn <- struct{}{}:
			s.leadRenewals()
			<-b.turn
		case <-ctx.Done():
			if b.withdraw(req) {
				return renewAnswer{err: ctx.Err()}
			}
			return <-req.done // a leader has it: its answer is the truth
		}
	}
}

func (b *renewBatcher) withdraw(req *renewReq) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, r := range b.queue {
		if r == req {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return true
		}
	}
	return false
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
WHERE attempts.id = r.id AND attempts.token_hash = r.hash AND attempts.job_id = r.job AND ` + fenceOpen +
	`attempts.generation = r.gen AND attempts.state = 'running' AND ` + leaseLiveAt(`r.now`) + fenceClose + `
RETURNING r.k, attempts.lease_expires_at, (SELECT cancel_requested FROM jobs WHERE jobs.id = attempts.job_id)`

// leadRenewals runs one batch of queued renewals in one statement. Its
// statement is never cancelled: it is other callers' too.
func (s *Store) leadRenewals() {
	b := s.rb
	b.mu.Lock()
	n := min(len(b.queue), maxRenewBatch)
	batch := make([]*renewReq, n)
	copy(batch, b.queue)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	b.mu.Unlock()
	if n == 0 {
		return
	}
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
		answers, err = s.renewBatch(batch, ids, gens, hashes, jobs, ttls, nows, ks)
	}
	for i, r := range batch {
		if err != nil {
			answers[i] = renewAnswer{err: err}
		}
		r.done <- answers[i]
	}
}

// renewBatch runs one batch's statement and returns each renewal's answer.
func (s *Store) renewBatch(batch []*renewReq, ids []string, gens []int64, hashes, jobs []string, ttls, nows, ks []int64) ([]renewAnswer, error) {
	b, n := s.rb, len(batch)
	answers := make([]renewAnswer, n)
	err := s.one(context.Background(), func(tx txn) error {
		b.statements.Add(1)
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
			r := batch[k]
			answers[k] = renewAnswer{ok: true, resp: wire.RenewResponse{LeaseExpiresAt: fromNS(exp),
				LeaseTTLMS: r.ttl.Milliseconds(), CancelRequested: cancel != 0}}
		}
		return rows.Err()
	})
	return answers, err
}
