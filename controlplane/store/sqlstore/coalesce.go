package sqlstore

import (
	"context"
	"sync"
	"sync/atomic"
)

// coalescer gathers PostgreSQL's concurrent calls of one kind, as
// sqliteWriter does SQLite's writes: up to lanes batches run at once, and
// every call queued while they all run goes into the next one, of at
// most max calls, which run answers in one statement (or one pipelined
// pair), each call fenced on its own row and answered on its own. A call
// that finds a lane free runs at once, alone or with those queued: no
// wait when there is no crowd. Whoever takes a lane leads, so a
// coalescer has no goroutine of its own.
type coalescer[R, A any] struct {
	max int
	// run answers one batch, in its order. It is never cancelled: the
	// batch is other callers' too.
	run func(batch []R) []A

	// turn holds a token per running batch, lanes at most. A channel,
	// so that a waiter inside a synctest bubble is durably blocked.
	turn chan struct{}

	mu    sync.Mutex      // guards queue and its calls' taken
	queue []*queued[R, A] // calls waiting for a leader, oldest first

	// For the tests that count them, counted by run: the coalesced
	// statements run, and the calls they answered.
	statements, answered atomic.Int64
}

// queued is one caller's call, waiting in the queue or in a batch.
type queued[R, A any] struct {
	req   R
	done  chan A // buffered; the answer, sent once
	taken bool   // in a batch; guarded by the coalescer's mu
}

func newCoalescer[R, A any](lanes, max int, run func([]R) []A) *coalescer[R, A] {
	return &coalescer[R, A]{max: max, run: run, turn: make(chan struct{}, lanes)}
}

// do queues req and returns its answer, or ctx's error if ctx ends
// before a leader takes it.
func (c *coalescer[R, A]) do(ctx context.Context, req R) (A, error) {
	q := &queued[R, A]{req: req, done: make(chan A, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, q)
	c.mu.Unlock()
	for {
		select {
		case a := <-q.done:
			return a, nil
		case c.turn <- struct{}{}:
			c.lead()
			<-c.turn
			c.mu.Lock()
			taken := q.taken
			c.mu.Unlock()
			if taken { // by this lead or another lane's: wait, not spin on a free lane
				return <-q.done, nil
			}
		case <-ctx.Done():
			if c.withdraw(q) {
				var zero A
				return zero, ctx.Err()
			}
			return <-q.done, nil // a leader has it: its answer is the truth
		}
	}
}

// lead runs one batch of the queued calls.
func (c *coalescer[R, A]) lead() {
	c.mu.Lock()
	n := min(len(c.queue), c.max)
	batch := make([]*queued[R, A], n)
	copy(batch, c.queue)
	for _, q := range batch {
		q.taken = true
	}
	c.queue = append(c.queue[:0], c.queue[n:]...)
	c.mu.Unlock()
	if n == 0 {
		return
	}
	reqs := make([]R, n)
	for i, q := range batch {
		reqs[i] = q.req
	}
	for i, a := range c.run(reqs) {
		batch[i].done <- a
	}
}

func (c *coalescer[R, A]) withdraw(q *queued[R, A]) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range c.queue {
		if r == q {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			return true
		}
	}
	return false
}

// unnestGuard is the worker guard of a batch's row r (columns id, gen,
// hash, job), judged at the SQL expression now.
func unnestGuard(now string) string {
	return `attempts.id = r.id AND attempts.token_hash = r.hash AND attempts.job_id = r.job AND ` + fenceOpen +
		`attempts.generation = r.gen AND attempts.state = 'running' AND ` + leaseLiveAt(now) + fenceClose
}
