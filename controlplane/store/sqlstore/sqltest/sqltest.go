// Package sqltest opens real sqlstore databases for the tests of other
// packages (the HTTP server, the command): a SQLite file in a temporary
// directory, or a fresh schema of the PostgreSQL test database named by
// RUNNERD_TEST_POSTGRES, which several stores may open at once, like
// replicas.
//
// Only tests import sqltest.
package sqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
)

// SQLite opens a store in a fresh file, closed when tb ends.
func SQLite(tb testing.TB, opts ...sqlstore.Option) *sqlstore.Store {
	tb.Helper()
	s, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(tb.TempDir(), "cp.db"), opts...)
	if err != nil {
		tb.Fatalf("OpenSQLite: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// Postgres opens a store in a fresh schema, closed when tb ends.
func Postgres(tb testing.TB, opts ...sqlstore.Option) *sqlstore.Store {
	tb.Helper()
	return OpenPostgres(tb, PostgresSchema(tb), opts...)
}

// OpenPostgres opens one more store on the database dsn (a replica),
// closed when tb ends.
func OpenPostgres(tb testing.TB, dsn string, opts ...sqlstore.Option) *sqlstore.Store {
	tb.Helper()
	s, err := sqlstore.OpenPostgres(context.Background(), dsn, opts...)
	if err != nil {
		tb.Fatalf("OpenPostgres: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// PostgresSchema creates a fresh schema in the test database, dropped
// when tb ends, and returns the DSN that selects it. It skips the test
// without RUNNERD_TEST_POSTGRES (fails under RUNNERD_REQUIRE_POSTGRES=1).
func PostgresSchema(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv("RUNNERD_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("RUNNERD_REQUIRE_POSTGRES") == "1" {
			tb.Fatal("RUNNERD_REQUIRE_POSTGRES=1 but RUNNERD_TEST_POSTGRES is not set")
		}
		tb.Skip("PostgreSQL skipped: set RUNNERD_TEST_POSTGRES to a DSN (see .ci/run)")
	}
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		tb.Fatal(err)
	}
	schema := "t_" + strings.ToLower(rand.Text())
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		admin.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		defer admin.Close()
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
