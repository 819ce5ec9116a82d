package sqlstore

// Commits is how many transactions SQLite's writer has committed.
func Commits(s *Store) int64 { return s.GroupCommits().Commits }

// HoldWriter takes SQLite's writer turn, as a running batch would, so
// that writes queue behind it; release gives it back.
func HoldWriter(s *Store) (release func()) {
	s.sw.turn <- struct{}{}
	return func() { <-s.sw.turn }
}

// RenewStatements is how many coalesced renewal statements PostgreSQL's
// batcher has run, and how many renewals they renewed.
func RenewStatements(s *Store) (statements, renewed int64) {
	return s.rb.statements.Load(), s.rb.answered.Load()
}

// FinishStatements is how many coalesced finish statements (pipelined
// pairs) PostgreSQL's batcher has run, and how many finishes they
// recorded.
func FinishStatements(s *Store) (statements, finished int64) {
	return s.fb.statements.Load(), s.fb.answered.Load()
}

// HoldRenewals takes the renewal batcher's lanes, as running batches
// would, so that renewals queue behind them; queued says how many wait;
// release gives the lanes back.
func HoldRenewals(s *Store) (queued func() int, release func()) { return hold(s.rb) }

// HoldFinishes is HoldRenewals for the finish batcher.
func HoldFinishes(s *Store) (queued func() int, release func()) { return hold(s.fb) }

// hold takes every lane of c.
func hold[R, A any](c *coalescer[R, A]) (queued func() int, release func()) {
	for range cap(c.turn) {
		c.turn <- struct{}{}
	}
	return func() int {
			c.mu.Lock()
			defer c.mu.Unlock()
			return len(c.queue)
		}, func() {
			for range cap(c.turn) {
				<-c.turn
			}
		}
}
