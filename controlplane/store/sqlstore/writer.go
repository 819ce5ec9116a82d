package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"
)

// maxBatch bounds the writes of one group commit, so that the first of
// them waits for at most this many others.
const maxBatch = 256

// sqliteWriter is SQLite's single writer: one connection, with its
// statements prepared once (database/sql would prepare every statement
// of a transaction anew, about a third of a fenced renewal) — its own
// BEGIN, SAVEPOINT, RELEASE and COMMIT too — and group
// commit. Every write queued while a transaction runs goes into the next
// one: whoever takes the turn leads, runs every queued write (each in its
// own savepoint, so that one write's failure rolls back only its own
// statements) and commits them together, then answers each caller — only
// after the commit, so an answer is never ahead of the disk. With
// synchronous=FULL that is one fsync for the whole batch (K9).
//
// No goroutine of its own: the leader is a caller, so a store inside a
// testing/synctest bubble does not outlive it.
type sqliteWriter struct {
	// turn is held by the leader of a batch. A channel, so that a waiter
	// inside a synctest bubble is durably blocked.
	turn chan struct{}

	mu    sync.Mutex  // guards queue
	queue []*writeReq // writes waiting for a leader, oldest first

	conn  *sql.Conn
	stmts map[string]*sql.Stmt // only touched while holding turn

	commits atomic.Int64 // transactions committed (GroupCommits)
	writes  atomic.Int64 // writes run in the committed transactions (GroupCommits)
	busy    atomic.Int64 // nanoseconds the leaders spent in batches (GroupCommits)

	// worked: a statement of the running transaction changed work_signal
	// (the 0012 triggers: a job may have become claimable); the commit
	// fires work. Set by the pre-update hook, which SQLite calls on the
	// leader's goroutine.
	worked atomic.Bool
	work   *signal
}

// watchWork has SQLite tell the writer of every change to work_signal on
// its connection (a pre-update hook), so that the commit can wake the
// claim long polls without anyone polling the table.
func (w *sqliteWriter) watchWork() error {
	return w.conn.Raw(func(dc any) error {
		h, ok := dc.(interface {
			RegisterPreUpdateHook(msqlite.PreUpdateHookFn)
		})
		if !ok {
			return errors.New("the SQLite driver has no pre-update hook")
		}
		h.RegisterPreUpdateHook(func(d msqlite.SQLitePreUpdateData) {
			if d.TableName == "work_signal" {
				w.worked.Store(true)
			}
		})
		return nil
	})
}

// writeReq is one caller's write, waiting in the queue or running in a batch.
type writeReq struct {
	ctx  context.Context
	fn   func(tx txn) error
	done chan error // buffered; the answer, sent once after the commit
}

func (w *sqliteWriter) write(ctx context.Context, fn func(tx txn) error) error {
	req := &writeReq{ctx: ctx, fn: fn, done: make(chan error, 1)}
	w.mu.Lock()
	w.queue = append(w.queue, req)
	w.mu.Unlock()
	for {
		select {
		case err := <-req.done:
			return err
		case w.turn <- struct{}{}:
			w.lead()
			<-w.turn
		case <-ctx.Done():
			if w.withdraw(req) {
				return ctx.Err()
			}
			// A leader has it: the write may commit, so wait for its answer.
			return <-req.done
		}
	}
}

// withdraw takes a write that no batch has taken off the queue.
func (w *sqliteWriter) withdraw(req *writeReq) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, r := range w.queue {
		if r == req {
			w.queue = append(w.queue[:i], w.queue[i+1:]...)
			return true
		}
	}
	return false
}

// lead runs one batch of queued writes in one transaction. Its own
// statements are never cancelled (the batch is other callers' too), and
// neither are the writes' (writer methods drop cancellation): an
// interrupted statement would roll back the whole transaction.
func (w *sqliteWriter) lead() {
	w.mu.Lock()
	n := min(len(w.queue), maxBatch)
	batch := make([]*writeReq, n)
	copy(batch, w.queue)
	w.queue = append(w.queue[:0], w.queue[n:]...)
	w.mu.Unlock()
	if n == 0 {
		return
	}
	defer func(start time.Time) { w.busy.Add(int64(time.Since(start))) }(time.Now())
	ctx := context.Background()
	answers := make([]error, n)
	ran := 0
	if _, err := w.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		for i := range answers {
			answers[i] = fmt.Errorf("begin: %w", err)
		}
		w.answer(batch, answers)
		return
	}
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			answers[i] = err // gone before it ran: nothing to commit
			continue
		}
		var broken error
		ran++
		answers[i], broken = w.run(ctx, r)
		if broken != nil {
			// The transaction itself failed (SQLite rolls back on an I/O
			// error or a full disk): nothing of this batch commits. The
			// writes not run yet go back to the queue for the next leader.
			w.rollback()
			for j := range i + 1 {
				answers[j] = fmt.Errorf("write batch rolled back: %w", broken)
			}
			w.requeue(batch[i+1:])
			w.answer(batch[:i+1], answers[:i+1])
			return
		}
	}
	if _, err := w.ExecContext(ctx, "COMMIT"); err != nil {
		w.rollback()
		for i := range answers {
			answers[i] = fmt.Errorf("commit: %w", err)
		}
	} else {
		w.commits.Add(1)
		w.writes.Add(int64(ran))
		if w.worked.Swap(false) {
			w.work.fire()
		}
	}
	w.answer(batch, answers)
}

// run runs one write in its own savepoint: answer is the write's own
// result, broken a failure of the transaction around it.
func (w *sqliteWriter) run(ctx context.Context, r *writeReq) (answer, broken error) {
	if _, err := w.ExecContext(ctx, "SAVEPOINT w"); err != nil {
		return nil, err
	}
	err := w.call(r)
	var k keep
	if err != nil && !errors.As(err, &k) {
		if _, rerr := w.ExecContext(ctx, "ROLLBACK TO w"); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
	}
	if _, rerr := w.ExecContext(ctx, "RELEASE w"); rerr != nil {
		return nil, rerr
	}
	if err != nil && errors.As(err, &k) {
		return k.err, nil // committed, and refused (a stale report is kept)
	}
	return err, nil
}

// GroupCommit counts what SQLite's single writer committed: transactions,
// and the writes run in them (each caller's write; a batch of n writes is
// one transaction). Writes per commit is how deep group commit batched.
type GroupCommit struct {
	Commits, Writes int64
	// Busy is the time the writer spent running batches, from taking the
	// first write off the queue to answering the last: the share of a
	// run's time it was busy says whether the one writer bounds it.
	Busy time.Duration
}

// Sub is what was counted since before.
func (g GroupCommit) Sub(before GroupCommit) GroupCommit {
	return GroupCommit{Commits: g.Commits - before.Commits, Writes: g.Writes - before.Writes, Busy: g.Busy - before.Busy}
}

// GroupCommits is the writer's count so far; zero on PostgreSQL, which
// has no single writer.
func (s *Store) GroupCommits() GroupCommit {
	if s.sw == nil {
		return GroupCommit{}
	}
	return GroupCommit{Commits: s.sw.commits.Load(), Writes: s.sw.writes.Load(), Busy: time.Duration(s.sw.busy.Load())}
}

// call runs a write's function; a panic fails that write only.
func (w *sqliteWriter) call(r *writeReq) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("write panicked: %v", p)
		}
	}()
	return r.fn(w)
}

func (w *sqliteWriter) answer(batch []*writeReq, answers []error) {
	for i, r := range batch {
		r.done <- answers[i]
	}
}

// requeue puts writes back at the front of the queue, in their order.
func (w *sqliteWriter) requeue(rs []*writeReq) {
	if len(rs) == 0 {
		return
	}
	w.mu.Lock()
	w.queue = append(append([]*writeReq{}, rs...), w.queue...)
	w.mu.Unlock()
}

func (w *sqliteWriter) rollback() {
	_, _ = w.ExecContext(context.Background(), "ROLLBACK")
	w.worked.Store(false) // nothing of it committed
}

func (w *sqliteWriter) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st, ok := w.stmts[query]; ok {
		return st, nil
	}
	st, err := w.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	w.stmts[query] = st
	return st, nil
}

// multi reports a script of several statements (a migration), which is
// run as it is rather than prepared.
func multi(query string) bool { return strings.Contains(strings.TrimSpace(query), ";") }

// The txn methods drop the caller's cancellation (see lead).

func (w *sqliteWriter) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	ctx = context.WithoutCancel(ctx)
	if multi(query) {
		return w.conn.ExecContext(ctx, query, args...)
	}
	st, err := w.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (w *sqliteWriter) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ctx = context.WithoutCancel(ctx)
	st, err := w.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

func (w *sqliteWriter) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	ctx = context.WithoutCancel(ctx)
	st, err := w.stmt(ctx, query)
	if err != nil {
		return w.conn.QueryRowContext(ctx, query, args...) // carries the error
	}
	return st.QueryRowContext(ctx, args...)
}

func (w *sqliteWriter) close() error {
	var err error
	for _, st := range w.stmts {
		err = errors.Join(err, st.Close())
	}
	return errors.Join(err, w.conn.Close())
}
