package sqlstore

import "context"

// Commits is how many transactions SQLite's writer has committed.
func Commits(s *Store) int64 { return s.sw.commits.Load() }

// HoldWriter takes SQLite's writer turn, as a running batch would, so
// that writes queue behind it; release gives it back.
func HoldWriter(s *Store) (release func()) {
	s.sw.turn <- struct{}{}
	return func() { <-s.sw.turn }
}

// WriterSynchronous reads PRAGMA synchronous on SQLite's writer
// connection: 1 is NORMAL, 2 is FULL.
func WriterSynchronous(ctx context.Context, s *Store) (int, error) {
	var n int
	err := s.write(ctx, func(tx txn) error {
		return tx.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&n)
	})
	return n, err
}

// RenewStatements is how many coalesced renewal statements PostgreSQL's
// batcher has run.
func RenewStatements(s *Store) int64 { return s.rb.statements.Load() }

// HoldRenewals takes the renewal batcher's turn, as a running batch
// would, so that renewals queue behind it; queued says how many wait;
// release gives the turn back.
func HoldRenewals(s *Store) (queued func() int, release func()) {
	s.rb.turn <- struct{}{}
	return func() int {
			s.rb.mu.Lock()
			defer s.rb.mu.Unlock()
			return len(s.rb.queue)
		}, func() {
			<-s.rb.turn
		}
}
