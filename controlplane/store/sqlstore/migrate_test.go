package sqlstore

import (
	"context"
	"database/sql"
	"io/fs"
	"path/filepath"
	"testing"

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
