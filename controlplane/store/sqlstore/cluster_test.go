package sqlstore

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"
)

// K8: the cluster identity is created with the database: reopening the
// same database (a restart, another replica) finds the same identity, and
// a new database — an empty one at a wrong DSN — has another.
func TestClusterIdentityCreatedWithDatabase(t *testing.T) {
	ctx := context.Background()
	// Each reopens a database of its dialect; SQLite's its own file.
	reopen := map[string]func(t *testing.T, s *Store) *Store{
		"sqlite": func(t *testing.T, _ *Store) *Store {
			path := filepath.Join(t.TempDir(), "cp.db")
			first, err := OpenSQLite(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			id, _ := first.ClusterID(ctx)
			first.Close()
			again, err := OpenSQLite(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { again.Close() })
			if got, _ := again.ClusterID(ctx); got != id || id == "" {
				t.Fatalf("reopened: %q, first %q", got, id)
			}
			return again
		},
		"postgres": func(t *testing.T, s *Store) *Store {
			var schema string
			if err := s.w.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
				t.Fatal(err)
			}
			u, err := url.Parse(PostgresTestDSN(t))
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			again, err := OpenPostgres(ctx, u.String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { again.Close() })
			return again
		},
	}
	for _, tc := range dialects {
		t.Run(tc.name, func(t *testing.T) {
			s, other := tc.open(t), tc.open(t)
			id, err := s.ClusterID(ctx)
			if err != nil || id == "" {
				t.Fatalf("ClusterID = %q, %v", id, err)
			}
			if o, _ := other.ClusterID(ctx); o == id {
				t.Fatalf("two databases share the identity %q", id)
			}
			again := reopen[tc.name](t, s)
			if tc.name == "postgres" {
				if got, _ := again.ClusterID(ctx); got != id {
					t.Fatalf("another replica on the same database: %q, want %q", got, id)
				}
			}
		})
	}
}
