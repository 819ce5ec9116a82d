package sqlstore

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// dialects opens a fresh store of each dialect.
var dialects = []struct {
	name string
	open func(testing.TB, ...Option) *Store
}{
	{"sqlite", OpenTestSQLite},
	{"postgres", OpenTestPostgres},
}

// The claim query must walk an index in the order of its ORDER BY: a scan
// of the jobs table, or a sort, turns tens of thousands of claims per
// second into about a thousand. The same holds for the reaper's query and
// the retention sweep's (P8), among thousands of ended jobs.
// Thousands of turns pinned to other hosts' sandboxes wait ahead of the
// claiming host's: the claim must not read them (host affinity). Thousands
// of released turns in their release backoff wait ahead of both (K7): the
// claim's walk of jobs_claim_any passes them and takes the turns behind.
// Thousands of turns that require labels (gpu) wait ahead of the rest: a
// host without those labels must not read them (routing), so the walk of
// jobs_claim_any is one range per route the host meets, never the queue.
func TestQueryPlansUseIndexes(t *testing.T) {
	reapQuery := `SELECT id FROM attempts WHERE state = 'running' AND lease_expires_at < ? ORDER BY lease_expires_at LIMIT ?`
	for _, tc := range dialects {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.open(t)
			// Enough rows that a cost-based planner would not scan: done
			// jobs and live attempts around the queued ones.
			fill(t, s, "run", 5000, true, t0.Add(time.Hour))
			fillBlocked(t, s, "blocked", 5000)
			fill(t, s, "backoff", 5000, false, time.Time{})
			backoff(t, s, "backoff", t0.Add(time.Minute))
			fill(t, s, "other", 5000, false, time.Time{})
			pin(t, s, "other", "host_other")
			fill(t, s, "gpu", 5000, false, time.Time{})
			route(t, s, "gpu", wire.Labels{"gpu": "a100", "sandbox": "docker"})
			labelHost(t, s, "host_gpu", wire.Labels{"gpu": "a100", "sandbox": "docker", "os": "linux"})
			fill(t, s, "q", 5000, false, time.Time{})
			ended(t, s, "done", 5000)
			for _, q := range []struct {
				name, query string
				indexes     []string
				args        []any
				allow       []string // problems this plan may have, said why below
			}{
				{"claim", s.claimStatement(false), []string{"jobs_claim_host", "jobs_claim_any"}, []any{"att_x", "host_bench", ns(t0), ns(t0), "host_bench"}, nil},
				{"claim by a labelled host", s.claimStatement(false), []string{"jobs_claim_host", "jobs_claim_any"}, []any{"att_y", "host_gpu", ns(t0), ns(t0), "host_gpu"}, nil},
				// PostgreSQL's claim of up to 8 turns in one statement: the same
				// walks, each at most 8 rows of its range. It sorts what the
				// walks found (at most 8 rows each, one walk per route met) and
				// the turns taken, and takes each by its key (pos = pick.pos,
				// checked below): neither reads the queue.
				{"claim of 8 turns in one statement", map[bool]string{true: claimPGStatement}[s.d == postgres],
					[]string{"jobs_claim_host", "jobs_claim_any"}, []any{"host_bench", ns(t0), 8, make([]string, 8), make([]string, 8),
						int64(time.Minute), ns(t0), nil, int64(0), "{"}, []string{"has Sort", "has using jobs_pkey on jobs jobs_"}},
				{"reap", reapQuery + s.lockSkip(), []string{"attempts_expiry"}, []any{ns(t0), 256}, nil},
				{"reclaim", reclaimQuery + s.lockSkip(), []string{"jobs_reclaim"}, []any{ns(t0), 100}, nil},
			} {
				if q.query == "" {
					continue
				}
				plan := s.explain(t, q.query, q.args...)
				t.Logf("%s plan:\n%s", q.name, plan)
				problems := slices.DeleteFunc(planProblems(plan, q.indexes...), func(p string) bool { return slices.Contains(q.allow, p) })
				if len(q.allow) > 0 && !strings.Contains(plan, "Index Cond: (pos = pick.pos)") {
					problems = append(problems, "takes its turns other than by their key")
				}
				if len(problems) > 0 {
					t.Errorf("%s plan: %v\n%s", q.name, problems, plan)
				}
			}
			// The statement explained is the one that claims: past the
			// other host's turns for this host, theirs for the other.
			// A host that meets no queued turn's requirements (gpu) reads
			// none of them: its plan walks jobs_claim_any only over the
			// routes it meets, and it is given the turn behind them all.
			for host, want := range map[string]string{"host_bench": "qj1", "host_other": "otherj1", "host_gpu": "gpuj1"} {
				c, ok, err := s.Claim(context.Background(), store.ClaimParams{HostID: host, WorkerTokenHash: []byte("w" + host), Now: t0})
				if err != nil || !ok || c.JobID != want {
					t.Errorf("Claim by %s = %s, %v, %v; want %s", host, c.JobID, ok, err, want)
				}
			}
			// The check itself catches a scan with a sort.
			scan := s.explain(t, `SELECT pos FROM jobs WHERE prompt = 'p' ORDER BY created_at LIMIT 1`)
			if len(planProblems(scan, "jobs_claim_any")) < 2 {
				t.Errorf("planProblems missed the scan and sort in:\n%s", scan)
			}
		})
	}
}

// backoff puts the queued jobs named by prefix in their release backoff
// until notBefore, as Release does (K7).
func backoff(tb testing.TB, s *Store, prefix string, notBefore time.Time) {
	tb.Helper()
	ctx := context.Background()
	if err := s.write(ctx, func(tx txn) error {
		_, err := s.exec(ctx, tx, `UPDATE jobs SET not_before = ?, release_count = 1, release_class = 'spawn_failed'
			WHERE id LIKE ? || 'j%' AND state = 'queued'`, ns(notBefore), prefix)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
}

// planProblems lists what makes a plan a scan: not using each index, a
// sequential or full-table scan, a walk of the primary key with a filter
// (PostgreSQL's other way to order by pos), or a sort.
func planProblems(plan string, indexes ...string) []string {
	var out []string
	for _, index := range indexes {
		if !strings.Contains(plan, index+" ") && !strings.Contains(plan, index+"\n") && !strings.HasSuffix(plan, index) {
			out = append(out, "does not use "+index)
		}
	}
	// routes, route_labels and host_labels are read whole: they are few
	// rows (distinct requirement sets, a host's labels), not the queue.
	for _, bad := range []string{"Seq Scan on jobs", "Seq Scan on attempts", "Sort", "TEMP B-TREE", "SCAN jobs\n", "SCAN attempts\n", "using jobs_pkey on jobs jobs_"} {
		if strings.Contains(plan+"\n", bad) {
			out = append(out, "has "+strings.TrimSpace(bad))
		}
	}
	return out
}

func (s *Store) explain(t *testing.T, query string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	if s.d == postgres {
		if _, err := s.w.ExecContext(ctx, "ANALYZE"); err != nil {
			t.Fatal(err)
		}
		rows, err := s.w.QueryContext(ctx, "EXPLAIN "+s.q(query), args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var lines []string
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, l)
		}
		return strings.Join(lines, "\n")
	}
	rows, err := s.r.QueryContext(ctx, "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, detail)
	}
	return strings.Join(lines, "\n")
}

// A concurrent CreateHost of a taken name meets the unique index; both
// dialects' errors must read as ErrExists.
func TestUniqueViolationRecognised(t *testing.T) {
	for _, tc := range dialects {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.open(t)
			insert := func(tx txn) error {
				_, err := s.exec(context.Background(), tx, `INSERT INTO hosts (id, name, token_hash, created_at) VALUES (?, 'dup', ?, 0)`, newID("host"), newID("tok"))
				return err
			}
			if err := s.write(context.Background(), insert); err != nil {
				t.Fatal(err)
			}
			err := s.write(context.Background(), insert)
			if err == nil || !isUniqueViolation(err) {
				t.Fatalf("duplicate insert: %v, not recognised as a unique violation", err)
			}
		})
	}
}

// The SQLite writer runs in WAL mode with the chosen synchronous level
// and a busy timeout; readers are read-only.
func TestSQLiteSettings(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		sync Synchronous
		want int
	}{{SyncNormal, 1}, {SyncFull, 2}} {
		s := OpenTestSQLite(t, WithSynchronous(tc.sync), WithBusyTimeout(1500*time.Millisecond))
		var mode string
		var sync, busy int
		err := s.write(ctx, func(tx txn) error {
			if err := tx.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
				return err
			}
			if err := tx.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
				return err
			}
			return tx.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy)
		})
		if err != nil || mode != "wal" || sync != tc.want || busy != 1500 {
			t.Fatalf("%s: journal_mode %q synchronous %d busy_timeout %d, %v", tc.sync, mode, sync, busy, err)
		}
		if _, err := s.r.ExecContext(ctx, `DELETE FROM hosts`); err == nil {
			t.Fatal("the read pool accepted a write")
		}
	}
	if _, err := OpenSQLite(ctx, t.TempDir()+"/x.db", WithSynchronous("OFF")); err == nil {
		t.Fatal("synchronous OFF was accepted")
	}
}
