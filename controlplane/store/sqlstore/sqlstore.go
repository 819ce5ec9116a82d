// Package sqlstore implements store.Store on SQLite (modernc.org/sqlite, no
// cgo) and on PostgreSQL (pgx through database/sql). Both share one body of
// SQL; the dialects differ only in schema types, placeholders and row
// locking. Migrations are embedded.
//
// Every rule about jobs, attempts, leases and conversations is decided by a
// guarded SQL statement here, never by the caller. Each attempt-scoped write
// starts with one UPDATE of the attempt row guarded by attempt id, lease
// generation, state running and lease expiry (P1); what follows in the same
// transaction only applies its consequences.
//
// Callers: OpenSQLite(ctx, path, opts...) or OpenPostgres(ctx, dsn, opts...),
// then the store.Store methods, then Close. Claim leaves wire.Claim's
// WorkerToken empty: the server makes the token and passes only its hash.
// The server takes every time it passes from Now, the store's one clock
// (K3), and calls ResumeAfterAbsence before serving and before each reaper
// sweep (P4).
//
// Only the controlplane packages import sqlstore. On SQLite it starts no
// goroutines of its own (database/sql keeps one per pool, ended by Close),
// so a store opened and closed inside a testing/synctest bubble does not
// outlive it; on PostgreSQL the first WorkSignal starts one more, the
// listener, ended by Close as well.
package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
)

//go:embed migrations
var migrationFS embed.FS

// Defaults of the options.
const (
	DefaultLeaseTTL      = 120 * time.Second
	DefaultMaxWorkerLost = 3
	DefaultBusyTimeout   = 5 * time.Second
)

// Synchronous is SQLite's PRAGMA synchronous in WAL mode.
type Synchronous string

const (
	// SyncFull makes every commit durable before it is answered (K9).
	// The default; group commit in the single writer keeps its cost to
	// one fsync per batch of queued writes.
	SyncFull Synchronous = "FULL"
	// SyncNormal may lose the last transactions on power loss, never
	// consistency: an acknowledged admission can roll back, after which
	// the reaper requeues a turn whose prompt the agent already has. Only
	// by explicit choice.
	SyncNormal Synchronous = "NORMAL"
)

// config holds the options; zero values mean the defaults.
type config struct {
	synchronous   Synchronous
	busyTimeout   time.Duration
	readConns     int
	leaseTTL      time.Duration
	maxWorkerLost int
	maxReleases   int                            // K7
	releaseWait   time.Duration                  // K7: the first release backoff
	clock         func(base time.Time) time.Time // nil: the base clock as it is
	txObserver    func(time.Duration, error)     // nil: none
	listenObs     func(error)                    // nil: none
}

// Option changes one setting of Open*.
type Option func(*config)

// WithSynchronous sets SQLite's synchronous level (ignored by PostgreSQL);
// the default is SyncFull.
func WithSynchronous(s Synchronous) Option { return func(c *config) { c.synchronous = s } }

// WithBusyTimeout sets SQLite's busy_timeout (ignored by PostgreSQL). Writes
// go through one connection, so it only matters against other processes.
func WithBusyTimeout(d time.Duration) Option { return func(c *config) { c.busyTimeout = d } }

// WithReadConns bounds the SQLite read pool (default 4).
func WithReadConns(n int) Option { return func(c *config) { c.readConns = n } }

// WithDefaultLeaseTTL is used when ClaimParams.LeaseTTL or a renewal's TTL is zero.
func WithDefaultLeaseTTL(d time.Duration) Option { return func(c *config) { c.leaseTTL = d } }

// WithMaxWorkerLost caps the uncounted requeues of one job (P6) for Finish
// with outcome worker_lost, and for Reap when ReapParams.MaxWorkerLost is 0.
func WithMaxWorkerLost(n int) Option { return func(c *config) { c.maxWorkerLost = n } }

// WithMaxReleases caps the releases (and declines) that requeue one job
// (K7); the next release fails it. Default store.DefaultMaxReleases.
func WithMaxReleases(n int) Option { return func(c *config) { c.maxReleases = n } }

// WithReleaseBackoff sets the first release backoff (K7); it doubles with
// each further release. Default store.DefaultReleaseBackoff.
func WithReleaseBackoff(d time.Duration) Option { return func(c *config) { c.releaseWait = d } }

// WithClock changes the time the store judges on: clock receives each
// reading of the store's own clock (the database's on PostgreSQL, the
// process's on SQLite) and returns the time to use. Tests move time with
// it, or give replicas offsets; production never sets it (K3).
func WithClock(clock func(base time.Time) time.Time) Option {
	return func(c *config) { c.clock = clock }
}

// WithTxObserver is told the duration and result of every write
// transaction, its wait for SQLite's single writer included (the control
// plane's controlplane_store_tx_duration_seconds).
func WithTxObserver(f func(d time.Duration, err error)) Option {
	return func(c *config) { c.txObserver = f }
}

// WithWorkListenObserver is told, on PostgreSQL, each time the store's
// listener (WorkSignal) begins listening (nil) and each time its
// connection failed (the error): while it is down, long polls find new
// work only by their own re-check.
func WithWorkListenObserver(f func(err error)) Option {
	return func(c *config) { c.listenObs = f }
}

func newConfig(opts []Option) config {
	c := config{}
	for _, o := range opts {
		o(&c)
	}
	if c.synchronous == "" {
		c.synchronous = SyncFull
	}
	if c.busyTimeout <= 0 {
		c.busyTimeout = DefaultBusyTimeout
	}
	if c.readConns <= 0 {
		c.readConns = 4
	}
	if c.leaseTTL <= 0 {
		c.leaseTTL = DefaultLeaseTTL
	}
	if c.maxWorkerLost <= 0 {
		c.maxWorkerLost = DefaultMaxWorkerLost
	}
	if c.maxReleases <= 0 {
		c.maxReleases = store.DefaultMaxReleases
	}
	if c.releaseWait <= 0 {
		c.releaseWait = store.DefaultReleaseBackoff
	}
	return c
}

type dialect int

const (
	sqlite dialect = iota
	postgres
)

// Store is the SQL implementation of store.Store.
type Store struct {
	w   *sql.DB   // writes: SQLite's single writer connection, or the PostgreSQL pool
	r   *readPool // reads: a separate SQLite pool, or the same PostgreSQL pool
	d   dialect
	cfg config
	sw  *sqliteWriter  // SQLite only
	rb  *renewBatcher  // PostgreSQL only
	fb  *finishBatcher // PostgreSQL only
	// work wakes the claim long polls (WorkSignal): fired by sw on
	// SQLite, by listen on PostgreSQL.
	work   *signal
	listen *listener // PostgreSQL only

	clusterMu sync.Mutex // guards cluster
	cluster   string     // the cluster identity once read (ClusterID); "" before
}

var _ store.Store = (*Store)(nil)

// Close closes the pools.
func (s *Store) Close() error {
	var err error
	if s.listen != nil {
		s.listen.close()
	}
	if s.sw != nil {
		err = s.sw.close()
	}
	if s.r.DB != s.w {
		err = errors.Join(err, s.r.Close())
	}
	err = errors.Join(err, s.w.Close())
	return err
}

// q adapts a query written with ? placeholders to the dialect.
func (s *Store) q(query string) string {
	if s.d != postgres {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// lockSkip is appended to a SELECT that picks rows to work on, so that
// concurrent PostgreSQL transactions take different rows. SQLite has one
// writer and needs nothing.
func (s *Store) lockSkip() string {
	if s.d == postgres {
		return " FOR UPDATE SKIP LOCKED"
	}
	return ""
}

// keep marks an error whose transaction must still commit: a refused write
// keeps its lease.stale_report event.
type keep struct{ err error }

func (k keep) Error() string { return k.err.Error() }
func (k keep) Unwrap() error { return k.err }

// txn is what a write transaction runs its statements on: a *sql.Tx on
// PostgreSQL, SQLite's writer connection with its prepared statements.
type txn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// write runs fn in a write transaction: on SQLite's one writer
// connection a savepoint of a BEGIN IMMEDIATE transaction that commits
// every write queued with it (group commit, sqliteWriter); READ COMMITTED
// on PostgreSQL, retried there on a deadlock or serialization failure,
// or on errRaced.
// Either way it returns only after the commit.
func (s *Store) write(ctx context.Context, fn func(tx txn) error) (err error) {
	if obs := s.cfg.txObserver; obs != nil {
		defer func(start time.Time) { obs(time.Since(start), err) }(time.Now())
	}
	if s.d == sqlite {
		return s.sw.write(ctx, fn)
	}
	for try := 0; ; try++ {
		err := s.writeOnce(ctx, fn)
		if err == nil || try >= 8 || !(s.retryable(err) || errors.Is(err, errRaced)) {
			return err
		}
	}
}

func (s *Store) writeOnce(ctx context.Context, fn func(tx txn) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	err = fn(tx)
	var k keep
	if err != nil && !errors.As(err, &k) {
		_ = tx.Rollback()
		return err
	}
	if cerr := tx.Commit(); cerr != nil {
		return fmt.Errorf("commit: %w", cerr)
	}
	if err != nil {
		return k.err
	}
	return nil
}

// ids runs a query whose one column is an id and returns the ids. query is
// already in the dialect (s.q applied).
func ids(ctx context.Context, tx txn, query string, args ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

func (s *Store) exec(ctx context.Context, tx txn, query string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, s.q(query), args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// Migrations are the files migrations/<dialect>/NNNN_what.sql, the same
// names in both dialects, numbered 0001, 0002, … without a gap or a
// repeat (migrationNames refuses any other set, so a merge that brings
// two files of one number fails every test that opens a store), applied
// in that order, each once: its name is recorded in schema_migrations in
// the transaction that applies it. A new migration is one more file at
// the end, numbered one past the last.
//
// Until this release four files shared the numbers 0006 and 0010, and
// those after them were numbered from there; renamedMigrations maps each
// name a database of the previous release recorded to the name the same
// file has now (bodies unchanged, order unchanged), and migrate records
// the new name beside each old one first, so that such a database applies
// only what it lacks. The old records stay: a replica of the previous
// release still running in a rolling upgrade finds its own names, stays
// ready and restarts without applying any again. Names are never reused:
// an old name is nobody's new name.
var renamedMigrations = []struct{ old, new string }{
	{"0006_cluster.sql", "0007_cluster.sql"},
	{"0006_release_cap.sql", "0008_release_cap.sql"},
	{"0007_host_lifecycle.sql", "0009_host_lifecycle.sql"},
	{"0010_quarantine.sql", "0011_quarantine.sql"},
	{"0011_routing.sql", "0012_routing.sql"},
	{"0012_work_signal.sql", "0013_work_signal.sql"},
	{"0013_agent_protocol.sql", "0014_agent_protocol.sql"},
}

// migrationDir is the dialect's directory of migrationFS.
func (d dialect) migrationDir() string {
	if d == postgres {
		return "migrations/postgres"
	}
	return "migrations/sqlite"
}

// migrationNames lists the migrations in fsys's dir in the order they
// apply, and refuses a set not numbered 1, 2, … n (four digits, an
// underscore, a name, .sql).
func migrationNames(fsys fs.FS, dir string) ([]string, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for i, name := range names {
		want := fmt.Sprintf("%04d_", i+1)
		if !strings.HasPrefix(name, want) || len(name) <= len(want)+len(".sql") || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("migration %s in %s: expected %s<name>.sql (numbers unique, in order, without a gap)", name, dir, want)
		}
	}
	return names, nil
}

// migrate records renamedMigrations' new names beside the old ones, then
// applies the embedded migrations of the dialect that are not yet
// recorded in schema_migrations, in order, all in one transaction.
func (s *Store) migrate(ctx context.Context) error {
	dir := s.d.migrationDir()
	names, err := migrationNames(migrationFS, dir)
	if err != nil {
		return err
	}
	return s.write(ctx, func(tx txn) error {
		if s.d == postgres {
			// Replicas starting together migrate one at a time.
			if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(7316201)"); err != nil {
				return fmt.Errorf("migration lock: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY)`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		for _, r := range renamedMigrations {
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO schema_migrations (name) SELECT ?
				WHERE EXISTS (SELECT 1 FROM schema_migrations WHERE name = ?)
				AND NOT EXISTS (SELECT 1 FROM schema_migrations WHERE name = ?)`), r.new, r.old, r.new); err != nil {
				return fmt.Errorf("rename migration %s: %w", r.old, err)
			}
		}
		for _, name := range names {
			var n int
			if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM schema_migrations WHERE name = ?`), name).Scan(&n); err != nil {
				return fmt.Errorf("read schema_migrations: %w", err)
			}
			if n > 0 {
				continue
			}
			body, err := fs.ReadFile(migrationFS, dir+"/"+name)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, string(body)); err != nil {
				return fmt.Errorf("migration %s: %w", name, err)
			}
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO schema_migrations (name) VALUES (?)`), name); err != nil {
				return fmt.Errorf("record migration %s: %w", name, err)
			}
		}
		// K8: a database gets its cluster identity once, with its schema.
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO cluster (id, cluster_id) SELECT 1, ?
			WHERE NOT EXISTS (SELECT 1 FROM cluster)`), newID("cluster")); err != nil {
			return fmt.Errorf("create the cluster identity: %w", err)
		}
		return nil
	})
}

// ClusterID returns the identity created with the database (K8).
//
// The identity is written once, with the schema, and never changes, so it
// is read once and kept: every claim carries it, and a claim costs no
// round trip for it. A read that fails is not kept.
func (s *Store) ClusterID(ctx context.Context) (string, error) {
	s.clusterMu.Lock()
	defer s.clusterMu.Unlock()
	if s.cluster != "" {
		return s.cluster, nil
	}
	var id string
	if err := s.r.QueryRowContext(ctx, `SELECT cluster_id FROM cluster WHERE id = 1`).Scan(&id); err != nil {
		return "", fmt.Errorf("cluster identity: %w", err)
	}
	s.cluster = id
	return id, nil
}

// newID returns a random identifier with a readable prefix, e.g. "job_…".
func newID(prefix string) string {
	return prefix + "_" + strings.ToLower(rand.Text())
}

func ns(t time.Time) int64 { return t.UnixNano() }

func fromNS(n int64) time.Time { return time.Unix(0, n).UTC() }

func nsPtr(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromNS(n.Int64)
	return &t
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
