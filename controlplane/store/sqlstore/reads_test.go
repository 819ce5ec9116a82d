package sqlstore

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// SQLite's reads prepare a query once and keep it, up to maxReadStmts
// queries; past the bound a query still answers, prepared for its one use;
// one that does not prepare carries its error to the caller.
func TestSQLiteReadsKeepPreparedStatements(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSQLite(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kept := func() int {
		s.r.mu.Lock()
		defer s.r.mu.Unlock()
		return len(s.r.stmts)
	}
	first, err := s.ClusterID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if id, err := s.ClusterID(ctx); err != nil || id != first {
			t.Fatalf("ClusterID again = %q, %v; want %q", id, err, first)
		}
	}
	if n := kept(); n != 1 {
		t.Fatalf("six reads of one query kept %d statements, want 1", n)
	}
	for i := range maxReadStmts + 10 {
		var n int
		if err := s.r.QueryRowContext(ctx, fmt.Sprintf("SELECT %d + ?", i), 1).Scan(&n); err != nil || n != i+1 {
			t.Fatalf("query %d = %d, %v; want %d", i, n, err, i+1)
		}
	}
	if n := kept(); n != maxReadStmts {
		t.Fatalf("%d distinct queries kept %d statements, want the bound %d", maxReadStmts+11, n, maxReadStmts)
	}
	var n int
	if err := s.r.QueryRowContext(ctx, "SELECT nope FROM nowhere").Scan(&n); err == nil {
		t.Fatal("a query of no table answered without an error")
	}
	rows, err := s.r.QueryContext(ctx, "SELECT nope FROM nowhere")
	if err == nil {
		rows.Close()
		t.Fatal("QueryContext of no table answered without an error")
	}
}
