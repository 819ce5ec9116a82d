package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// Test helpers: stores of both dialects (exported to the external tests
// of this directory), and bulk fills that write rows the way the store
// itself would, thousands at a time.

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// OpenTestSQLite opens a store in a fresh file, closed when tb ends.
func OpenTestSQLite(tb testing.TB, opts ...Option) *Store {
	tb.Helper()
	s, err := OpenSQLite(context.Background(), filepath.Join(tb.TempDir(), "cp.db"), opts...)
	if err != nil {
		tb.Fatalf("OpenSQLite: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

// OpenTestPostgres opens a store in a fresh schema, or skips without a DSN
// (fails under RUNNERD_REQUIRE_POSTGRES=1).
func OpenTestPostgres(tb testing.TB, opts ...Option) *Store {
	tb.Helper()
	s, err := OpenPostgres(context.Background(), postgresSchema(tb), opts...)
	if err != nil {
		tb.Fatalf("OpenPostgres: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

// postgresSchema creates a fresh, empty schema, dropped when tb ends, and
// returns the DSN that selects it.
func postgresSchema(tb testing.TB) string {
	tb.Helper()
	dsn := PostgresTestDSN(tb)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { admin.Close() })
	schema := "b_" + strings.ToLower(rand.Text())
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if _, err := admin.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			tb.Errorf("drop schema: %v", err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// PostgresTestDSN returns RUNNERD_TEST_POSTGRES, or skips the test when
// it is unset (fails under RUNNERD_REQUIRE_POSTGRES=1).
func PostgresTestDSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv("RUNNERD_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("RUNNERD_REQUIRE_POSTGRES") == "1" {
			tb.Fatal("RUNNERD_REQUIRE_POSTGRES=1 but RUNNERD_TEST_POSTGRES is not set")
		}
		tb.Skip("PostgreSQL skipped: set RUNNERD_TEST_POSTGRES to a DSN (see .ci/run)")
	}
	return dsn
}

// series is a CTE of the integers 1..? that both dialects understand.
const series = `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) `

// fill adds count conversations with one job each, named by prefix. With
// running, each job has a running attempt of host "host_bench" whose
// lease expires at exp, and whose worker token hash is prefix+i.
func fill(tb testing.TB, s *Store, prefix string, count int, running bool, exp time.Time) {
	tb.Helper()
	ctx := context.Background()
	now := ns(t0)
	state, head, gen := "queued", 1, 0
	if running {
		state, gen = "running", 1
	}
	err := s.write(ctx, func(tx txn) error {
		if _, err := s.exec(ctx, tx, `INSERT INTO hosts (id, name, token_hash, created_at) VALUES ('host_bench', 'bench', 'bench', ?)
			ON CONFLICT DO NOTHING`, now); err != nil {
			return err
		}
		if _, err := s.exec(ctx, tx, `INSERT INTO conversations (id, agent_command, state, next_seq, created_at, updated_at) `+series+
			`SELECT ? || 'c' || i, '["agent"]', 'usable', 1, ?, ? FROM n`, count, prefix, now, now); err != nil {
			return err
		}
		if _, err := s.exec(ctx, tx, `INSERT INTO jobs (id, conversation_id, seq, prompt, state, head, generation, attempt_count,
			live_attempt_id, created_at) `+series+`SELECT ? || 'j' || i, ? || 'c' || i, 1, 'p', ?, ?, ?, ?,
			CASE WHEN ? = 1 THEN ? || 'a' || i END, ? FROM n`,
			count, prefix, prefix, state, head, gen, gen, gen, prefix, now); err != nil {
			return err
		}
		if !running {
			return nil
		}
		_, err := s.exec(ctx, tx, `INSERT INTO attempts (id, job_id, generation, state, host_id, lease_owner, lease_ttl,
			lease_expires_at, claimed_at, token_hash) `+series+`SELECT ? || 'a' || i, ? || 'j' || i, 1, 'running',
			'host_bench', 'bench', ?, ?, ?, ? || 'a' || i FROM n`,
			count, prefix, prefix, int64(120*time.Second), ns(exp), now, prefix)
		return err
	})
	if err != nil {
		tb.Fatalf("fill: %v", err)
	}
}

// fillBlocked adds one conversation whose first turn is running and whose
// count later turns wait behind it, ahead in the queue of anything filled
// after.
func fillBlocked(tb testing.TB, s *Store, prefix string, count int) {
	tb.Helper()
	ctx := context.Background()
	now := ns(t0)
	err := s.write(ctx, func(tx txn) error {
		if _, err := s.exec(ctx, tx, `INSERT INTO conversations (id, agent_command, state, next_seq, created_at, updated_at)
			VALUES (? || 'conv', '["agent"]', 'usable', ?, ?, ?)`, prefix, count+1, now, now); err != nil {
			return err
		}
		_, err := s.exec(ctx, tx, `INSERT INTO jobs (id, conversation_id, seq, prompt, state, head, created_at) `+series+
			`SELECT ? || 'j' || i, ? || 'conv', i, 'p', CASE WHEN i = 1 THEN 'running' ELSE 'queued' END,
			CASE WHEN i = 1 THEN 1 ELSE 0 END, ? FROM n`, count+1, prefix, prefix, now)
		return err
	})
	if err != nil {
		tb.Fatalf("fillBlocked: %v", err)
	}
}

// pin gives the conversations and jobs filled under prefix a sandbox on
// host hostID (registered here if new), so that only it may claim them.
func pin(tb testing.TB, s *Store, prefix, hostID string) {
	tb.Helper()
	ctx := context.Background()
	err := s.write(ctx, func(tx txn) error {
		if _, err := s.exec(ctx, tx, `INSERT INTO hosts (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)
			ON CONFLICT DO NOTHING`, hostID, hostID, hostID, ns(t0)); err != nil {
			return err
		}
		if _, err := s.exec(ctx, tx, `UPDATE conversations SET sandbox_host_id = ?, container_id = 'ctr' WHERE id LIKE ? || 'c%'`,
			hostID, prefix); err != nil {
			return err
		}
		_, err := s.exec(ctx, tx, `UPDATE jobs SET sandbox_host_id = ? WHERE id LIKE ? || 'j%'`, hostID, prefix)
		return err
	})
	if err != nil {
		tb.Fatalf("pin: %v", err)
	}
}

// ended adds count jobs that ended at t0, half of them with their detail
// already reclaimed.
func ended(tb testing.TB, s *Store, prefix string, count int) {
	tb.Helper()
	fill(tb, s, prefix, count, false, time.Time{})
	ctx := context.Background()
	err := s.write(ctx, func(tx txn) error {
		_, err := s.exec(ctx, tx, `UPDATE jobs SET state = 'succeeded', head = 0, ended_at = ?,
			detail_reclaimed_at = CASE WHEN pos % 2 = 0 THEN ended_at END WHERE id LIKE ? || 'j%'`, ns(t0), prefix)
		return err
	})
	if err != nil {
		tb.Fatalf("ended: %v", err)
	}
}

// route makes the conversations and jobs filled under prefix require
// labels, as CreateConversation and EnqueueTurn would.
func route(tb testing.TB, s *Store, prefix string, labels wire.Labels) {
	tb.Helper()
	ctx := context.Background()
	r := labels.String()
	err := s.write(ctx, func(tx txn) error {
		if err := s.ensureRoute(ctx, tx, r, labels); err != nil {
			return err
		}
		if _, err := s.exec(ctx, tx, `UPDATE conversations SET requires = ? WHERE id LIKE ? || 'c%'`, r, prefix); err != nil {
			return err
		}
		_, err := s.exec(ctx, tx, `UPDATE jobs SET route = ? WHERE id LIKE ? || 'j%'`, r, prefix)
		return err
	})
	if err != nil {
		tb.Fatalf("route: %v", err)
	}
}

// labelHost registers hostID (if new) with labels, as its heartbeat would.
func labelHost(tb testing.TB, s *Store, hostID string, labels wire.Labels) {
	tb.Helper()
	ctx := context.Background()
	err := s.write(ctx, func(tx txn) error {
		if _, err := s.exec(ctx, tx, `INSERT INTO hosts (id, name, token_hash, created_at) VALUES (?, ?, ?, ?)
			ON CONFLICT DO NOTHING`, hostID, hostID, hostID, ns(t0)); err != nil {
			return err
		}
		return s.setHostLabels(ctx, tx, hostID, labels)
	})
	if err != nil {
		tb.Fatalf("labelHost: %v", err)
	}
}
