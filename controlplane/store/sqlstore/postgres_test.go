package sqlstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/storetest"
)

// postgresDSN returns the test database's DSN, or skips (fails under
// RUNNERD_REQUIRE_POSTGRES=1) when RUNNERD_TEST_POSTGRES is unset.
func postgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("RUNNERD_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("RUNNERD_REQUIRE_POSTGRES") == "1" {
			t.Fatal("RUNNERD_REQUIRE_POSTGRES=1 but RUNNERD_TEST_POSTGRES is not set")
		}
		t.Skip("PostgreSQL tests skipped: set RUNNERD_TEST_POSTGRES to a DSN (see .ci/run)")
	}
	return dsn
}

// openPostgres opens a store in a fresh schema of its own, dropped when t
// ends, so tests run in parallel and repeatedly.
func openPostgres(t testing.TB, opts ...sqlstore.Option) *sqlstore.Store {
	t.Helper()
	dsn := postgresDSN(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open admin connection: %v", err)
	}
	t.Cleanup(func() { admin.Close() })
	schema := "t_" + strings.ToLower(rand.Text())
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP SCHEMA " + schema + " CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	st, err := sqlstore.OpenPostgres(context.Background(), withSearchPath(t, dsn, schema), opts...)
	if err != nil {
		t.Fatalf("OpenPostgres: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return st
}

func withSearchPath(t testing.TB, dsn, schema string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("parse RUNNERD_TEST_POSTGRES: %v", err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " search_path=" + schema
}

func TestPostgresConformance(t *testing.T) {
	postgresDSN(t)
	storetest.Run(t, func(t *testing.T) store.Store { return openPostgres(t) })
}
