package sqlstore

import (
	"context"
	"database/sql"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/runnerd/runnerd/controlplane/store"
)

// A database made before host affinity is upgraded in place: a
// conversation with a recorded container is pinned to the host of the
// attempt that last recorded it, and so is its queued turn, which only that
// host can then claim.
func TestUpgradePinsRecordedSandboxes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cp.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	first, err := fs.ReadFile(migrationFS, "migrations/sqlite/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		string(first),
		`CREATE TABLE schema_migrations (name TEXT PRIMARY KEY); INSERT INTO schema_migrations VALUES ('0001_init.sql')`,
		`INSERT INTO hosts (id, name, token_hash, created_at) VALUES ('h1', 'host-1', 't1', 0), ('h2', 'host-2', 't2', 0)`,
		`INSERT INTO conversations (id, agent_command, state, container_id, next_seq, created_at, updated_at) VALUES
			('pinned', '["a"]', 'usable', 'ctr', 2, 0, 0), ('free', '["a"]', 'usable', '', 1, 0, 0)`,
		`INSERT INTO jobs (id, conversation_id, seq, prompt, state, head, created_at, ended_at) VALUES
			('j1', 'pinned', 1, 'p', 'succeeded', 0, 0, 1), ('j2', 'pinned', 2, 'p', 'queued', 1, 0, NULL),
			('j3', 'free', 1, 'p', 'queued', 1, 0, NULL)`,
		// j1 ran twice: host-1 recorded the container first, host-2 last.
		`INSERT INTO attempts (id, job_id, generation, state, host_id, lease_owner, lease_ttl, lease_expires_at, claimed_at,
			token_hash, container_id) VALUES ('a1', 'j1', 1, 'superseded', 'h1', 'host-1', 1, 1, 0, 'x1', 'ctr'),
			('a2', 'j1', 2, 'finished', 'h2', 'host-2', 1, 1, 0, 'x2', 'ctr')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for id, want := range map[string]string{"pinned": "host-2", "free": ""} {
		if c, err := s.GetConversation(ctx, id); err != nil || c.SandboxHost != want {
			t.Fatalf("conversation %s: sandbox host %q, %v; want %q", id, c.SandboxHost, err, want)
		}
	}
	claim := func(host string) string {
		c, ok, err := s.Claim(ctx, store.ClaimParams{HostID: host, WorkerTokenHash: []byte("w" + host), Now: t0})
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ""
		}
		return c.JobID
	}
	if got := claim("h1"); got != "j3" {
		t.Fatalf("host-1 claimed %q, want j3 (j2 is pinned to host-2)", got)
	}
	if got := claim("h1"); got != "" {
		t.Fatalf("host-1 claimed %q, want nothing", got)
	}
	if got := claim("h2"); got != "j2" {
		t.Fatalf("host-2 claimed %q, want j2", got)
	}
}

// A database made before events were numbered per job is upgraded in
// place, on both dialects: each job's events are numbered 1, 2, … in their
// old order, and the next event of a job takes the next number.
func TestUpgradeNumbersEventsPerJob(t *testing.T) {
	ctx := context.Background()
	for _, dialect := range []string{"sqlite", "postgres"} {
		t.Run(dialect, func(t *testing.T) {
			var raw *sql.DB
			var open func() (*Store, error)
			if dialect == "sqlite" {
				path := filepath.Join(t.TempDir(), "cp.db")
				db, err := sql.Open("sqlite", path)
				if err != nil {
					t.Fatal(err)
				}
				raw, open = db, func() (*Store, error) { return OpenSQLite(ctx, path) }
			} else {
				dsn := postgresSchema(t)
				db, err := sql.Open("pgx", dsn)
				if err != nil {
					t.Fatal(err)
				}
				raw, open = db, func() (*Store, error) { return OpenPostgres(ctx, dsn) }
			}
			q := []string{`CREATE TABLE schema_migrations (name TEXT PRIMARY KEY)`}
			for _, name := range []string{"0001_init.sql", "0002_sandbox_host.sql", "0003_retention.sql"} {
				body, err := fs.ReadFile(migrationFS, "migrations/"+dialect+"/"+name)
				if err != nil {
					t.Fatal(err)
				}
				q = append(q, string(body), `INSERT INTO schema_migrations VALUES ('`+name+`')`)
			}
			q = append(q,
				`INSERT INTO conversations (id, agent_command, state, next_seq, created_at, updated_at) VALUES ('c', '["a"]', 'usable', 2, 0, 0)`,
				`INSERT INTO jobs (id, conversation_id, seq, prompt, state, head, created_at) VALUES
					('j1', 'c', 1, 'p', 'succeeded', 0, 0), ('j2', 'c', 2, 'p', 'queued', 1, 0)`,
				// Interleaved global ids, as the sequence gave them.
				`INSERT INTO job_events (job_id, time, source, type) VALUES
					('j1', 1, 'control', 'queued'), ('j2', 2, 'control', 'queued'), ('j1', 3, 'control', 'claimed'),
					('j1', 4, 'control', 'finished'), ('j2', 5, 'control', 'cancel_requested')`,
			)
			for _, stmt := range q {
				if _, err := raw.ExecContext(ctx, stmt); err != nil {
					t.Fatalf("%s: %v", stmt, err)
				}
			}
			raw.Close()
			s, err := open()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			want := map[string][]string{"j1": {"queued", "claimed", "finished"}, "j2": {"queued", "cancel_requested"}}
			for job, types := range want {
				evs, err := s.JobEvents(ctx, job, 0, 0)
				if err != nil || len(evs) != len(types) {
					t.Fatalf("%s: %d events, %v; want %d", job, len(evs), err, len(types))
				}
				for i, e := range evs {
					if e.ID != int64(i+1) || e.Type != types[i] {
						t.Fatalf("%s event %d = %d %s, want %d %s", job, i, e.ID, e.Type, i+1, types[i])
					}
				}
			}
			if _, err := s.CancelJob(ctx, "j2", t0); err != nil {
				t.Fatal(err)
			}
			evs, err := s.JobEvents(ctx, "j2", 2, 0)
			if err != nil || len(evs) == 0 || evs[0].ID != 3 {
				t.Fatalf("j2's next event = %+v, %v; want number 3", evs, err)
			}
		})
	}
}

// previousRelease is what a database of the previous release recorded in
// schema_migrations, in the order it applied them: the names before the
// files were renumbered (four shared 0006 and 0010). The bodies are the
// files of the same name after the number, which the renumbering left as
// they were.
var previousRelease = []string{
	"0001_init.sql", "0002_sandbox_host.sql", "0003_retention.sql", "0004_one_clock.sql", "0005_user_tokens.sql",
	"0006_claim_key.sql", "0006_cluster.sql", "0006_release_cap.sql", "0007_host_lifecycle.sql",
	"0010_interrupted.sql", "0010_quarantine.sql", "0011_routing.sql", "0012_work_signal.sql", "0013_agent_protocol.sql",
}

// The migrations of each dialect are numbered 1 … n, each number once,
// and both dialects have the same names; a set with a repeated number (a
// merge of two branches that each added one) or a gap is refused, so no
// store opens on it. Every old name of renamedMigrations is gone, every
// new one is a file, and together they map previousRelease onto the
// names of its files.
func TestMigrationNumbersUniqueAndOrdered(t *testing.T) {
	lite, err := migrationNames(migrationFS, sqlite.migrationDir())
	if err != nil {
		t.Fatal(err)
	}
	pg, err := migrationNames(migrationFS, postgres.migrationDir())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(lite, pg) {
		t.Fatalf("the dialects' migrations differ:\nsqlite   %v\npostgres %v", lite, pg)
	}
	renamed := map[string]string{}
	for _, r := range renamedMigrations {
		if slices.Contains(lite, r.old) || !slices.Contains(lite, r.new) {
			t.Errorf("rename %s → %s: the old name is a file, or the new one is not", r.old, r.new)
		}
		renamed[r.old] = r.new
	}
	var upgraded []string
	for _, old := range previousRelease {
		if n, ok := renamed[old]; ok {
			old = n
		}
		upgraded = append(upgraded, old)
	}
	if !slices.Equal(upgraded, lite[:len(previousRelease)]) {
		t.Errorf("the previous release's migrations renamed = %v, want the first %d files %v", upgraded, len(previousRelease), lite)
	}
	for _, bad := range []fstest.MapFS{
		{"m/0001_a.sql": {}, "m/0002_b.sql": {}, "m/0002_c.sql": {}},
		{"m/0001_a.sql": {}, "m/0003_b.sql": {}},
		{"m/0001_a.sql": {}, "m/0002_b.txt": {}},
		{"m/0001_a.sql": {}, "m/2_b.sql": {}},
	} {
		if names, err := migrationNames(bad, "m"); err == nil {
			t.Errorf("migrationNames accepted %v", names)
		}
	}
	if names, err := migrationNames(fstest.MapFS{"m/0001_a.sql": {}, "m/0002_b.sql": {}}, "m"); err != nil || len(names) != 2 {
		t.Errorf("migrationNames of 0001, 0002 = %v, %v", names, err)
	}
}

// A database created by the previous release — its migrations recorded
// under their old names — migrates forward cleanly on both dialects: the
// store opens it without applying any migration twice (each would fail:
// a column or table added again), records the current names beside the
// old ones (a replica of the previous release, in a rolling upgrade, still
// finds its own), is ready, and ends with the schema a new database has; its rows are kept and its
// queued turn is claimed. The same from a release that had applied only
// the first of the migrations numbered 0006 twice, whose other 0006 is
// still to apply (under its new number).
func TestUpgradeFromPreviousReleaseNumbering(t *testing.T) {
	ctx := context.Background()
	for _, tc := range dialects {
		for _, upTo := range []string{"0013_agent_protocol.sql", "0006_cluster.sql"} {
			t.Run(tc.name+"/through "+upTo, func(t *testing.T) {
				var raw *sql.DB
				var open func() (*Store, error)
				if tc.name == "sqlite" {
					path := filepath.Join(t.TempDir(), "cp.db")
					db, err := sql.Open("sqlite", path)
					if err != nil {
						t.Fatal(err)
					}
					raw, open = db, func() (*Store, error) { return OpenSQLite(ctx, path) }
				} else {
					dsn := postgresSchema(t)
					db, err := sql.Open("pgx", dsn)
					if err != nil {
						t.Fatal(err)
					}
					raw, open = db, func() (*Store, error) { return OpenPostgres(ctx, dsn) }
				}
				d := map[string]dialect{"sqlite": sqlite, "postgres": postgres}[tc.name]
				current, err := migrationNames(migrationFS, d.migrationDir())
				if err != nil {
					t.Fatal(err)
				}
				bodyOf := func(old string) string {
					for _, name := range current {
						if name[4:] == old[4:] {
							body, err := fs.ReadFile(migrationFS, d.migrationDir()+"/"+name)
							if err != nil {
								t.Fatal(err)
							}
							return string(body)
						}
					}
					t.Fatalf("no file for the previous release's %s", old)
					return ""
				}
				q := []string{`CREATE TABLE schema_migrations (name TEXT PRIMARY KEY)`}
				applied := previousRelease[:slices.Index(previousRelease, upTo)+1]
				for _, old := range applied {
					q = append(q, bodyOf(old), `INSERT INTO schema_migrations VALUES ('`+old+`')`)
				}
				q = append(q,
					`INSERT INTO hosts (id, name, token_hash, created_at) VALUES ('h1', 'host-1', 't1', 0)`,
					`INSERT INTO conversations (id, agent_command, state, next_seq, created_at, updated_at) VALUES ('c', '["a"]', 'usable', 2, 0, 0)`,
					`INSERT INTO jobs (id, conversation_id, seq, prompt, state, head, created_at) VALUES ('j1', 'c', 1, 'p', 'queued', 1, 0)`,
				)
				for _, stmt := range q {
					if _, err := raw.ExecContext(ctx, stmt); err != nil {
						t.Fatalf("%s: %v", stmt, err)
					}
				}
				raw.Close()
				s, err := open()
				if err != nil {
					t.Fatalf("opening the previous release's database: %v", err)
				}
				t.Cleanup(func() { s.Close() })
				// The current names, and the old ones kept for a replica of
				// the previous release.
				want := slices.Clone(current)
				for _, old := range applied {
					if !slices.Contains(want, old) {
						want = append(want, old)
					}
				}
				slices.Sort(want)
				recorded, err := ids(ctx, s.r, `SELECT name FROM schema_migrations ORDER BY name`)
				if err != nil || !slices.Equal(recorded, want) {
					t.Fatalf("schema_migrations = %v, %v; want %v", recorded, err, want)
				}
				if err := s.Ready(ctx); err != nil {
					t.Fatalf("Ready = %v", err)
				}
				if got, want := schemaOf(t, s), schemaOf(t, tc.open(t)); !slices.Equal(got, want) {
					t.Errorf("the upgraded schema differs from a new database's:\nupgraded %q\nnew      %q", got, want)
				}
				c, ok, err := s.Claim(ctx, store.ClaimParams{HostID: "h1", WorkerTokenHash: []byte("wh1"), Now: t0})
				if err != nil || !ok || c.JobID != "j1" || c.Turn.Prompt != "p" {
					t.Fatalf("Claim = %+v, %v, %v; want j1", c, ok, err)
				}
				// Opening it again (a second replica, or a restart) applies nothing.
				again, err := open()
				if err != nil {
					t.Fatalf("opening the upgraded database again: %v", err)
				}
				again.Close()
			})
		}
	}
}

// schemaOf describes s's schema, one line per table, column, index and
// constraint, with the PostgreSQL schema's own name left out so that two
// test schemas compare.
func schemaOf(t *testing.T, s *Store) []string {
	t.Helper()
	query := `SELECT type || ' ' || name || ' ' || COALESCE(sql, '') FROM sqlite_master ORDER BY type, name`
	if s.d == postgres {
		query = `SELECT replace(x, current_schema() || '.', '') FROM (
			SELECT 'column ' || table_name || '.' || column_name || ' ' || ordinal_position || ' ' || data_type || ' ' ||
				is_nullable || ' ' || COALESCE(column_default, '') AS x
			FROM information_schema.columns WHERE table_schema = current_schema()
			UNION ALL SELECT 'index ' || indexname || ' ' || indexdef FROM pg_indexes WHERE schemaname = current_schema()
			UNION ALL SELECT 'constraint ' || c.conrelid::regclass::text || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
			FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = current_schema()
			UNION ALL SELECT 'trigger ' || event_object_table || ' ' || trigger_name || ' ' || action_statement
			FROM information_schema.triggers WHERE trigger_schema = current_schema()
		) AS d ORDER BY 1`
	}
	lines, err := ids(context.Background(), s.r, query)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) < 20 {
		t.Fatalf("a schema of %d lines: %q", len(lines), lines)
	}
	return lines
}
