package sqlstore

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// jobStates are the states Stats counts, so that a state with no job
// reads 0 rather than disappearing.
var jobStates = []string{wire.JobQueued, wire.JobRunning, wire.JobSucceeded, wire.JobFailed, wire.JobCancelled}

// Stats counts jobs by state and running attempts, on the read pool.
func (s *Store) Stats(ctx context.Context) (store.Stats, error) {
	st := store.Stats{JobsByState: map[string]int{}}
	for _, state := range jobStates {
		st.JobsByState[state] = 0
	}
	rows, err := s.r.QueryContext(ctx, `SELECT state, COUNT(*) FROM jobs GROUP BY state`)
	if err != nil {
		return store.Stats{}, fmt.Errorf("stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n int
		if err := rows.Scan(&state, &n); err != nil {
			return store.Stats{}, fmt.Errorf("stats: %w", err)
		}
		st.JobsByState[state] = n
	}
	if err := rows.Err(); err != nil {
		return store.Stats{}, fmt.Errorf("stats: %w", err)
	}
	st.JobsByCause = map[wire.Cause]int{}
	crows, err := s.r.QueryContext(ctx, `SELECT cause, COUNT(*) FROM jobs WHERE cause <> '' GROUP BY cause`)
	if err != nil {
		return store.Stats{}, fmt.Errorf("stats: %w", err)
	}
	defer crows.Close()
	for crows.Next() {
		var cause string
		var n int
		if err := crows.Scan(&cause, &n); err != nil {
			return store.Stats{}, fmt.Errorf("stats: %w", err)
		}
		st.JobsByCause[wire.Cause(cause)] = n
	}
	if err := crows.Err(); err != nil {
		return store.Stats{}, fmt.Errorf("stats: %w", err)
	}
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM attempts WHERE state = 'running'`).Scan(&st.LiveLeases); err != nil {
		return store.Stats{}, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}

// Ready reads schema_migrations and checks that every migration embedded
// in this build is applied: a database another build migrated further is
// still ready (migrations only add), one missing a migration is not.
func (s *Store) Ready(ctx context.Context) error {
	dir := "migrations/sqlite"
	if s.d == postgres {
		dir = "migrations/postgres"
	}
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return err
	}
	applied := map[string]bool{}
	rows, err := s.r.QueryContext(ctx, `SELECT name FROM schema_migrations`)
	if err != nil {
		return fmt.Errorf("ready: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return fmt.Errorf("ready: %w", err)
		}
		applied[name] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ready: %w", err)
	}
	for _, e := range entries {
		if !applied[e.Name()] {
			return fmt.Errorf("ready: %w: migration %s is not applied", store.ErrSchemaBehind, e.Name())
		}
	}
	return nil
}
