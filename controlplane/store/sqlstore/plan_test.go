package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
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
// On PostgreSQL every hot statement of the worker's path — the claim of
// many turns, the coalesced renewal, the coalesced finish and its advance
// (and their forms for a batch of one), an upload of events — runs under
// EXPLAIN ANALYZE among 10,000 running attempts, analysed, and must read
// about the rows of its batch: no sequential scan of jobs or attempts, and
// no node reading all the running attempts (hotStatementPlans).
func TestQueryPlansUseIndexes(t *testing.T) {
	reapQuery := `SELECT id FROM attempts WHERE state = 'running' AND lease_expires_at < ? ORDER BY lease_expires_at LIMIT ?`
	for _, tc := range dialects {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.open(t)
			// Enough rows that a cost-based planner would not scan: done
			// jobs and live attempts around the queued ones.
			fill(t, s, "run", runningAttempts, true, t0.Add(time.Hour))
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
			if s.d == postgres {
				hotStatementPlans(t, s)
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

// runningAttempts is how many running attempts TestQueryPlansUseIndexes
// fills: a busy fleet's, so that a plan reading them all shows.
const runningAttempts = 10000

// hotStatementPlans runs each hot statement of PostgreSQL's worker path
// on batches of the running attempts fill made ("run"), each in a
// transaction rolled back after, under EXPLAIN (ANALYZE) with fresh
// statistics, and fails when a plan scans jobs or attempts sequentially or
// has a node on either that reads more than a few rows per item of its
// batch (a nested loop, or a hash join, over all the running attempts). A
// check after each statement, in its transaction, sees that it did its
// work, so that a plan of a statement that changed nothing cannot pass.
func hotStatementPlans(t *testing.T, s *Store) {
	ctx := context.Background()
	fillEvents(t, s, "run", runningAttempts)
	if _, err := s.w.ExecContext(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	const n = 64
	ids, hashes, jobs := make([]string, n), make([]string, n), make([]string, n)
	gens, ttls, nows, ks := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	reps, heads, tails, data, outcomes, jstates, reasons := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i := range n {
		ids[i], hashes[i], jobs[i] = fmt.Sprintf("runa%d", i+1), fmt.Sprintf("runa%d", i+1), fmt.Sprintf("runj%d", i+1)
		gens[i], ttls[i], nows[i], ks[i] = 1, int64(time.Minute), ns(t0), int64(i)
		reps[i], heads[i], tails[i], data[i] = `{"op":"finish"}`, `{"job_state":"failed","conversation_state":`, `}`, `{}`
		outcomes[i], jstates[i], reasons[i] = wire.OutcomeFailed, wire.JobFailed, reasonFailed
	}
	claimIDs, claimHashes := make([]string, 8), make([]string, 8)
	for i := range claimIDs {
		claimIDs[i], claimHashes[i] = fmt.Sprintf("att_plan%d", i), fmt.Sprintf("plan%d", i)
	}
	type step struct {
		query string
		args  []any
		batch int // the items the statement takes
		// pass is an index whose walk may pass rows by its filter, said
		// why where it is set.
		pass string
	}
	const (
		finishedOf = `SELECT COUNT(*) FROM attempts a JOIN jobs j ON j.id = a.job_id
			WHERE a.id = ANY($1) AND a.state = 'finished' AND j.state = 'failed' AND j.live_attempt_id IS NULL`
		renewedOf = `SELECT COUNT(*) FROM attempts WHERE id = ANY($1) AND lease_expires_at = $2`
	)
	for _, tc := range []struct {
		name  string
		steps []step
		check string // counts what the steps did
		args  []any
		want  int
	}{
		// The claim's walk of jobs_claim_any passes the turns in their
		// release backoff (K7, claimStatement): a filter on the rows it
		// meets, 5,000 of them here; what it reads besides is its batch.
		{"claim of 8 turns", []step{{claimPGStatement, []any{"host_bench", ns(t0), 8, claimIDs, claimHashes,
			int64(time.Minute), ns(t0.Add(time.Minute)), nil, int64(0), "{"}, 8, "jobs_claim_any"}},
			`SELECT COUNT(*) FROM attempts a JOIN jobs j ON j.live_attempt_id = a.id WHERE a.id = ANY($1) AND j.state = 'running'`,
			[]any{claimIDs}, 8},
		{"renew batch", []step{{renewSQL[postgres], []any{ids, gens, hashes, jobs, ttls, nows}, n, ""}},
			renewedOf, []any{ids, ns(t0.Add(time.Minute))}, n},
		{"renew batch at the database's clock", []step{{renewSQL[postgres], []any{ids, gens, hashes, jobs, ttls, make([]int64, n)}, n, ""}},
			`SELECT COUNT(*) FROM attempts WHERE id = ANY($1) AND lease_expires_at < $2`, []any{ids, ns(t0.Add(time.Hour))}, n},
		{"finish batch", []step{
			{coalescedFinish, []any{ids, gens, hashes, jobs, nows, reps, heads, tails, data, outcomes, jstates, reasons, ks}, n, ""},
			{coalescedAdvance, []any{ids, nows}, n, ""},
		}, finishedOf, []any{ids}, n},
		{"finish of one", []step{
			{oneFinish, []any{nows[0], ids[0], gens[0], hashes[0], jobs[0], reps[0], heads[0], tails[0], data[0], outcomes[0], jstates[0], reasons[0]}, 1, ""},
			{oneAdvance, []any{ids[0], nows[0]}, 1, ""},
		}, finishedOf, []any{ids[:1]}, 1},
		// Each running attempt has stored eventsPerAttempt events; the
		// upload is the next four.
		{"events batch", []step{{appendEventsPGStatement, []any{ns(t0), ids[0], gens[0], hashes[0], jobs[0],
			[]int64{eventsPerAttempt + 1, eventsPerAttempt + 2, eventsPerAttempt + 3, eventsPerAttempt + 4}, make([]int64, 4),
			[]string{"a", "b", "c", "d"}, []string{"{}", "{}", "{}", "{}"}, int64(4)}, 4, ""}},
			`SELECT COUNT(*) FROM job_events WHERE attempt_id = $1 AND seq IS NOT NULL`, []any{ids[0]}, eventsPerAttempt + 4},
	} {
		func() {
			tx, err := s.w.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			for i, st := range tc.steps {
				var out string
				if err := tx.QueryRowContext(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+st.query, st.args...).Scan(&out); err != nil {
					t.Fatalf("%s, statement %d: %v", tc.name, i+1, err)
				}
				var plans []struct{ Plan planNode }
				if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
					t.Fatalf("%s, statement %d: plan %s: %v", tc.name, i+1, out, err)
				}
				bound := 4*st.batch + 16
				if problems := plans[0].Plan.problems(bound, st.pass); len(problems) > 0 {
					t.Errorf("%s, statement %d (a batch of %d, among %d running attempts): %v\n%s", tc.name, i+1, st.batch,
						runningAttempts, problems, plans[0].Plan.String())
				} else {
					t.Logf("%s, statement %d:\n%s", tc.name, i+1, plans[0].Plan.String())
				}
			}
			var got int
			if err := tx.QueryRowContext(ctx, tc.check, tc.args...).Scan(&got); err != nil || got != tc.want {
				t.Errorf("%s: %d items done, %v; want %d", tc.name, got, err, tc.want)
			}
		}()
	}
}

// eventsPerAttempt is how many runner events fillEvents stores for each
// running attempt.
const eventsPerAttempt = 8

// fillEvents stores eventsPerAttempt runner events (seqs 1 …) for each of
// the count running attempts fill made with prefix, numbered as the store
// numbers them, so that job_events has the statistics of a busy fleet.
func fillEvents(tb testing.TB, s *Store, prefix string, count int) {
	tb.Helper()
	ctx := context.Background()
	err := s.write(ctx, func(tx txn) error {
		if _, err := s.exec(ctx, tx, `INSERT INTO job_events (job_id, n, attempt_id, seq, time, source, type, data) `+series+
			`SELECT ? || 'j' || ((i - 1) / ?  + 1), (i - 1) % ? + 1, ? || 'a' || ((i - 1) / ? + 1), (i - 1) % ? + 1, ?,
				'runner', 'agent.output', '{}' FROM n`,
			count*eventsPerAttempt, prefix, eventsPerAttempt, eventsPerAttempt, prefix, eventsPerAttempt, eventsPerAttempt, ns(t0)); err != nil {
			return err
		}
		_, err := s.exec(ctx, tx, `INSERT INTO job_event_counts (job_id, last) `+series+`SELECT ? || 'j' || i, ? FROM n`,
			count, prefix, eventsPerAttempt)
		return err
	})
	if err != nil {
		tb.Fatalf("fill events: %v", err)
	}
}

// planNode is a node of EXPLAIN (ANALYZE, FORMAT JSON)'s plan.
type planNode struct {
	NodeType   string     `json:"Node Type"`
	Relation   string     `json:"Relation Name"`
	Index      string     `json:"Index Name"`
	Rows       float64    `json:"Actual Rows"`
	Loops      float64    `json:"Actual Loops"`
	Filtered   float64    `json:"Rows Removed by Filter"`
	JoinFilter float64    `json:"Rows Removed by Join Filter"`
	Plans      []planNode `json:"Plans"`
}

// read is the rows the node read of its relation over all its loops,
// those its filter removed too unless its index is pass.
func (p planNode) read(pass string) float64 {
	n := p.Rows
	if p.Index == "" || p.Index != pass {
		n += p.Filtered
	}
	return n * max(p.Loops, 1)
}

// problems lists each node that scans jobs, attempts or job_events
// sequentially, or reads more than bound of their rows.
func (p planNode) problems(bound int, pass string) []string {
	var out []string
	if p.Relation == "jobs" || p.Relation == "attempts" || p.Relation == "job_events" {
		if p.NodeType == "Seq Scan" {
			out = append(out, "a sequential scan of "+p.Relation)
		}
		if r := p.read(pass); r > float64(bound) {
			out = append(out, fmt.Sprintf("%s on %s reads %.0f rows (%.0f loops), more than %d", p.NodeType, p.Relation, r, p.Loops, bound))
		}
	}
	for _, c := range p.Plans {
		out = append(out, c.problems(bound, pass)...)
	}
	return out
}

// String is the plan as an indented list of nodes with what each read.
func (p planNode) String() string {
	var b strings.Builder
	var walk func(planNode, int)
	walk = func(n planNode, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), n.NodeType)
		if n.Relation != "" {
			fmt.Fprintf(&b, " on %s", n.Relation)
		}
		if n.Index != "" {
			fmt.Fprintf(&b, " using %s", n.Index)
		}
		fmt.Fprintf(&b, " (rows %.0f, loops %.0f, removed %.0f)\n", n.Rows, n.Loops, n.Filtered)
		for _, c := range n.Plans {
			walk(c, depth+1)
		}
	}
	walk(p, 0)
	return b.String()
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
