package sqlstore

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// A renewal has one path: RenewAs queues it on PostgreSQL's renewal
// coalescer (s.rb), whose leader runs every renewal queued meanwhile in
// one statement (on SQLite, one statement of one renewal in the single
// writer's next transaction, which gathers the concurrent ones), sql/<dialect>/renew.sql, fenced on each item's own row and
// returning each item's attempt row, renewed or not; verdict words the
// ones it did not renew. Nothing else writes a lease's renewal.

// maxRenewBatch bounds the renewals of one statement.
const maxRenewBatch = 1024

type renewBatcher = coalescer[renewItem, renewAnswer]

func (s *Store) newRenewBatcher() *renewBatcher { return newCoalescer(1, maxRenewBatch, s.renewBatch) }

// renewItem is one caller's renewal.
type renewItem struct {
	item
	ttl time.Duration
	now int64 // Unix nanoseconds; 0: the database's clock, read in the statement
}

type renewAnswer struct {
	resp wire.RenewResponse
	row  row
	err  error
}

var renewSQL = [...]string{sqlite: statement(sqlite, "renew"), postgres: statement(postgres, "renew")}

// RenewAs extends the worker's lease by ttl from now and returns the
// cancel flag (P7). The zero now is the store's clock: on PostgreSQL the
// database's, read inside the statement (K3).
func (s *Store) RenewAs(ctx context.Context, w store.Worker, ref wire.AttemptRef, ttl time.Duration, now time.Time) (wire.RenewResponse, error) {
	return s.renew(ctx, item{w: w, hash: hex.EncodeToString(w.TokenHash), ref: ref}, ttl, now)
}

func (s *Store) renew(ctx context.Context, in item, ttl time.Duration, now time.Time) (wire.RenewResponse, error) {
	if ttl <= 0 {
		ttl = s.cfg.leaseTTL
	}
	it := renewItem{item: in, ttl: ttl}
	if !now.IsZero() || s.d == sqlite || s.cfg.clock != nil {
		t, err := s.nowOr(ctx, now)
		if err != nil {
			return wire.RenewResponse{}, fmt.Errorf("renew: %w", err)
		}
		it.now = ns(t)
	}
	a, err := s.renewOne(ctx, it)
	if err == nil {
		err = a.err
	}
	if err == nil {
		if why := verdict(wire.OpRenew, it.item, a.row); why != nil {
			err = s.refuse(ctx, wire.OpRenew, it.item, a.row, why)
		}
	}
	if err != nil {
		return wire.RenewResponse{}, fmt.Errorf("renew: %w", err)
	}
	return a.resp, nil
}

// Renew is RenewAs as the attempt's own worker: for the tests and tools
// that hold an attempt but not its token. ErrNotFound for an unknown
// attempt.
func (s *Store) Renew(ctx context.Context, ref wire.AttemptRef, ttl time.Duration, now time.Time) (wire.RenewResponse, error) {
	in := item{ref: ref}
	err := s.r.QueryRowContext(ctx, s.q(`SELECT job_id, token_hash FROM attempts WHERE id = ?`), ref.AttemptID).Scan(&in.w.JobID, &in.hash)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return wire.RenewResponse{}, fmt.Errorf("renew: %w", err)
	}
	return s.renew(ctx, in, ttl, now)
}

// renewOne answers one renewal: through the coalescer on PostgreSQL, as
// a batch of one on SQLite, whose single writer gathers concurrent writes
// into one transaction by itself.
func (s *Store) renewOne(ctx context.Context, it renewItem) (renewAnswer, error) {
	if s.d == sqlite {
		return s.renewBatch([]renewItem{it})[0], nil
	}
	return s.rb.do(ctx, it)
}

// nowOr is now, or the store's clock when it is zero.
func (s *Store) nowOr(ctx context.Context, now time.Time) (time.Time, error) {
	if now.IsZero() {
		return s.Now(ctx)
	}
	return now, nil
}

// renewBatch runs one batch of renewals and returns each one's answer. A
// statement names each attempt once (an UPDATE changes a row once), so
// renewals of one attempt in one batch go into statements one after
// another, in their order.
func (s *Store) renewBatch(batch []renewItem) []renewAnswer {
	answers := make([]renewAnswer, len(batch))
	for rest := indexes(len(batch)); len(rest) > 0; {
		var round, later []int
		seen := make(map[string]bool, len(rest))
		for _, k := range rest {
			if seen[batch[k].ref.AttemptID] {
				later = append(later, k)
				continue
			}
			seen[batch[k].ref.AttemptID] = true
			round = append(round, k)
		}
		s.renewRound(batch, round, answers)
		rest = later
	}
	return answers
}

func indexes(n int) []int {
	ks := make([]int, n)
	for i := range ks {
		ks[i] = i
	}
	return ks
}

// renewRound runs the renewals batch[k] for k in round in one statement.
func (s *Store) renewRound(batch []renewItem, round []int, answers []renewAnswer) {
	args, err := s.renewArgs(batch, round)
	ctx := context.Background() // never cancelled: the batch is other callers' too
	// The statement locks its rows in the order of its join: against
	// another statement locking many (ResumeAfterAbsence) PostgreSQL may
	// end one of them as a deadlock, after which it simply runs again.
	for try := 0; err == nil; try++ {
		for _, k := range round {
			answers[k] = renewAnswer{}
		}
		err = s.one(ctx, func(tx txn) error {
			if s.rb != nil {
				s.rb.statements.Add(1)
			}
			return s.renewRows(ctx, tx, args, batch, round, answers)
		})
		if err == nil || !s.retryable(err) || try == 7 {
			break
		}
		err = nil
	}
	for _, k := range round {
		if err != nil {
			answers[k] = renewAnswer{err: err}
		} else if answers[k].row.changed && s.rb != nil {
			s.rb.answered.Add(1)
		}
	}
}

// renewArgs are the statement's arguments for the items of round: arrays
// on PostgreSQL, the one item's values on SQLite (whose batch is the
// single writer's transaction). An item is known again by its attempt id,
// unique in a round.
func (s *Store) renewArgs(batch []renewItem, round []int) ([]any, error) {
	n := len(round)
	gens, ttls, nows := make([]int64, n), make([]int64, n), make([]int64, n)
	ids, hashes, jobs := make([]string, n), make([]string, n), make([]string, n)
	for i, k := range round {
		it := batch[k]
		ids[i], gens[i], hashes[i], jobs[i] = it.ref.AttemptID, it.ref.LeaseGeneration, it.hash, it.w.JobID
		ttls[i], nows[i] = int64(it.ttl), it.now
	}
	if s.d == postgres {
		return []any{ids, gens, hashes, jobs, ttls, nows}, nil
	}
	if n != 1 {
		return nil, fmt.Errorf("a SQLite renewal statement takes one item, not %d", n)
	}
	return []any{ids[0], gens[0], hashes[0], jobs[0], ttls[0], nows[0]}, nil
}

// renewRows runs the statement and records each returned item's row and
// answer.
func (s *Store) renewRows(ctx context.Context, tx txn, args []any, batch []renewItem, round []int, answers []renewAnswer) error {
	byID := make(map[string]int, len(round))
	for _, k := range round {
		byID[batch[k].ref.AttemptID] = k
	}
	rows, err := tx.QueryContext(ctx, renewSQL[s.d], args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, state string
		var now, gen, ttl, exp, cancel int64
		if err := rows.Scan(&id, &now, &gen, &state, &ttl, &exp, &cancel); err != nil {
			return err
		}
		k, ok := byID[id]
		if !ok {
			return fmt.Errorf("renewal of attempt %s, which the batch does not hold", id)
		}
		it := batch[k]
		if now == 0 {
			now = it.now // SQLite returns the item's own
		}
		// Renewed: the fence held and the lease now runs to now + TTL. A
		// lease the fence held out cannot end there: one that ran out
		// ended by now, and a finished or superseded attempt's was set at
		// an earlier now (fenceInGo: off only in the broken build).
		fenced := !fenceInGo || gen == it.ref.LeaseGeneration && state == wire.AttemptRunning
		changed := fenced && ttl == int64(it.ttl) && exp == now+int64(it.ttl)
		answers[k] = renewAnswer{
			row:  row{found: true, changed: changed, jobID: it.w.JobID, generation: gen, state: state, now: now},
			resp: wire.RenewResponse{LeaseExpiresAt: fromNS(exp), LeaseTTLMS: it.ttl.Milliseconds(), CancelRequested: cancel != 0},
		}
	}
	return rows.Err()
}
