package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/wire"
)

// storeKind names a store a benchmark runs on.
type storeKind string

const (
	sqliteFull storeKind = "sqlite" // synchronous=FULL, the default (K9)
	postgres   storeKind = "postgres"
)

// openStore opens a fresh, empty store of kind k: a SQLite file in a
// temporary directory, or a new PostgreSQL schema. close removes it.
func (b *bench) openStore(ctx context.Context, k storeKind) (s *sqlstore.Store, closeFn func(), err error) {
	s, _, closeFn, err = b.openCounted(ctx, k)
	return s, closeFn, err
}

// openCounted is openStore that also counts PostgreSQL's round trips
// (sqltest.CountRoundTrips; nil on SQLite).
func (b *bench) openCounted(ctx context.Context, k storeKind) (s *sqlstore.Store, trips *atomic.Int64, closeFn func(), err error) {
	switch k {
	case sqliteFull:
		dir, err := os.MkdirTemp("", "runnerd-bench-")
		if err != nil {
			return nil, nil, nil, err
		}
		s, err := sqlstore.OpenSQLite(ctx, filepath.Join(dir, "cp.db"), sqlstore.WithSynchronous(sqlstore.SyncFull))
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, nil, err
		}
		return s, nil, func() { s.Close(); os.RemoveAll(dir) }, nil
	case postgres:
		admin, err := sql.Open("pgx", b.o.postgres)
		if err != nil {
			return nil, nil, nil, err
		}
		schema := "bench_" + strings.ToLower(rand.Text())
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
			admin.Close()
			return nil, nil, nil, err
		}
		drop := func() {
			_, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE")
			admin.Close()
		}
		u, err := url.Parse(b.o.postgres)
		if err != nil {
			drop()
			return nil, nil, nil, err
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		name, trips, unregister, err := sqltest.CountRoundTrips(u.String())
		if err != nil {
			drop()
			return nil, nil, nil, err
		}
		s, err := sqlstore.OpenPostgres(ctx, name)
		if err != nil {
			unregister()
			drop()
			return nil, nil, nil, err
		}
		return s, trips, func() { s.Close(); unregister(); drop() }, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown store %q", k)
}

// parallel runs f(i) for every i in [0, n) on workers goroutines and
// returns how long that took; the first error stops the others.
func parallel(ctx context.Context, workers, n int, f func(ctx context.Context, i int) error) (time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return elapsed, err
	}
	return elapsed, ctx.Err()
}

// host registers a host with a fresh token and returns its id and token.
func newHost(ctx context.Context, s store.Store, name string) (id, token string, err error) {
	token = controlplane.HostTokenPrefix + rand.Text()
	now, err := s.Now(ctx)
	if err != nil {
		return "", "", err
	}
	h, err := s.CreateHost(ctx, name, controlplane.HashToken(token), store.Audit{Actor: "test"}, now)
	return h.ID, token, err
}

// queue creates n conversations of one queued turn each (workers at once)
// and returns the conversations' ids.
func queue(ctx context.Context, s store.Store, workers, n int, argv []string) ([]string, error) {
	ids := make([]string, n)
	_, err := parallel(ctx, workers, n, func(ctx context.Context, i int) error {
		now, err := s.Now(ctx)
		if err != nil {
			return err
		}
		c, err := s.CreateConversation(ctx, wire.CreateConversationRequest{Title: fmt.Sprint("bench ", i), AgentCommand: argv}, now)
		if err != nil {
			return err
		}
		ids[i] = c.ID
		_, err = s.EnqueueTurn(ctx, c.ID, "bench", now)
		return err
	})
	return ids, err
}

// lease is one running attempt a benchmark holds.
type lease struct {
	jobID string
	ref   wire.AttemptRef
	token string // the worker token (its hash is in the store)
}

// worker is what the lease's worker token authorizes, as the HTTP
// handlers pass it to the store.
func (l lease) worker() store.Worker {
	return store.Worker{JobID: l.jobID, TokenHash: controlplane.HashToken(l.token)}
}

// claimAll claims n queued turns for hostID through the store, each with
// a worker token of its own, and returns the leases.
func claimAll(ctx context.Context, s store.Store, workers, n int, hostID string, ttl time.Duration) ([]lease, error) {
	out := make([]lease, n)
	_, err := parallel(ctx, workers, n, func(ctx context.Context, i int) error {
		now, err := s.Now(ctx)
		if err != nil {
			return err
		}
		tok := controlplane.WorkerTokenPrefix + rand.Text()
		c, ok, err := s.Claim(ctx, store.ClaimParams{HostID: hostID, LeaseTTL: ttl, WorkerTokenHash: controlplane.HashToken(tok), Now: now})
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("claim %d of %d: nothing to claim", i+1, n)
		}
		out[i] = lease{jobID: c.JobID, ref: wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}, token: tok}
		return nil
	})
	return out, err
}
