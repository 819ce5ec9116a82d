package controlplane_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/internal/syncbuf"
	"github.com/runnerd/runnerd/wire"
)

// openStore opens a real SQLite store in a fresh temporary directory.
func openStore(t testing.TB, opts ...sqlstore.Option) store.Store {
	t.Helper()
	return sqliteDB(t).open(t, opts...)
}

// database is one real database; open gives a new handle on it, as a
// restarted control plane or another replica would open it.
type database struct {
	name string
	open func(t testing.TB, opts ...sqlstore.Option) store.Store
}

// sqliteDB is a SQLite database in a fresh temporary directory.
func sqliteDB(t testing.TB) database {
	path := filepath.Join(t.TempDir(), "cp.db")
	return database{name: "sqlite", open: func(t testing.TB, opts ...sqlstore.Option) store.Store {
		t.Helper()
		st, err := sqlstore.OpenSQLite(context.Background(), path, opts...)
		if err != nil {
			t.Fatalf("open sqlite store: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}}
}

// postgresDB is a fresh schema of the PostgreSQL test database (see
// sqltest.PostgresSchema).
func postgresDB(t testing.TB) database {
	t.Helper()
	dsn := sqltest.PostgresSchema(t)
	return database{name: "postgres", open: func(t testing.TB, opts ...sqlstore.Option) store.Store {
		t.Helper()
		return sqltest.OpenPostgres(t, dsn, opts...)
	}}
}

// stores are the two databases the HTTP tests of server behaviour that
// depends on the database run on.
var stores = []struct {
	name string
	db   func(t testing.TB) database
}{
	{"sqlite", sqliteDB},
	{"postgres", postgresDB},
}

// onEachDatabase runs fn as a subtest on each of stores.
func onEachDatabase(t *testing.T, fn func(t *testing.T, db database)) {
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) { fn(t, sc.db(t)) })
	}
}

// clock is the store's clock (and the server's own), moved by hand where
// a test needs leases to expire; everything else in these tests runs on
// real time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

const userToken = "rdu_test-user-token-0123456789"

// fixture is a real server on a real SQLite store behind a loopback
// httptest server, with one registered host.
type fixture struct {
	t         *testing.T
	db        database
	st        store.Store
	hs        *httptest.Server
	srv       *controlplane.Server
	clock     *clock
	url       string
	wc        *wire.Client
	hostToken string
	logs      *syncbuf.Buffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOn(t, sqliteDB(t))
}

// newFixtureOn is newFixture on db.
func newFixtureOn(t *testing.T, db database) *fixture {
	t.Helper()
	f := &fixture{
		t:     t,
		db:    db,
		clock: &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)},
		logs:  &syncbuf.Buffer{},
	}
	f.start()
	if _, err := f.st.CreateUserToken(context.Background(), "test", controlplane.HashToken(userToken), store.Audit{Actor: "test"}, f.clock.Now()); err != nil {
		t.Fatalf("create the user token: %v", err)
	}
	f.hostToken = f.addHost("host-a")
	return f
}

// start opens a handle on the fixture's database whose clock is the
// fixture's, and serves it.
func (f *fixture) start() {
	f.t.Helper()
	f.st = f.db.open(f.t, sqlstore.WithClock(func(time.Time) time.Time { return f.clock.Now() }))
	f.srv = controlplane.New(controlplane.Config{
		Store:  f.st,
		Logger: slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:    f.clock.Now,
	})
	f.hs = httptest.NewServer(f.srv.Handler())
	f.t.Cleanup(f.hs.Close)
	f.url = f.hs.URL
	f.wc = &wire.Client{BaseURL: f.hs.URL, HTTP: f.hs.Client()}
}

// restart stops serving and closes the store, then opens the same
// database again and serves it at a new address, as a restarted control
// plane would. It does not sweep.
func (f *fixture) restart() {
	f.t.Helper()
	f.hs.Close()
	if err := f.st.Close(); err != nil {
		f.t.Fatalf("close store: %v", err)
	}
	f.start()
}

func (f *fixture) addHost(name string) string {
	f.t.Helper()
	tok := controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := f.st.CreateHost(context.Background(), name, controlplane.HashToken(tok), store.Audit{Actor: "test"}, f.clock.Now()); err != nil {
		f.t.Fatalf("create host %s: %v", name, err)
	}
	return tok
}

// do sends a raw request and returns the status and the answer's body.
func (f *fixture) do(method, path, token, body string) (int, []byte) {
	f.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// code is the wire error code of an answer body ("" if none).
func code(b []byte) string {
	var eb wire.ErrorBody
	_ = json.Unmarshal(b, &eb)
	return eb.Code
}

// expect checks a raw call's status and error code.
func (f *fixture) expect(method, path, token, body string, status int, wantCode string) []byte {
	f.t.Helper()
	got, b := f.do(method, path, token, body)
	if got != status || code(b) != wantCode {
		f.t.Fatalf("%s %s: HTTP %d %q, want %d %q (body %s)", method, path, got, code(b), status, wantCode, b)
	}
	return b
}

// user calls the user API through the thin client and decodes into out.
func (f *fixture) user(method, path string, body, out any) {
	f.t.Helper()
	if _, err := f.wc.Do(context.Background(), method, path, userToken, body, out); err != nil {
		f.t.Fatalf("%s %s: %v", method, path, err)
	}
}

func (f *fixture) newConversation() wire.Conversation {
	f.t.Helper()
	var c wire.Conversation
	f.user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{
		Title: "test", Image: "demo:latest", AgentCommand: []string{"demo-agent"},
	}, &c)
	return c
}

func (f *fixture) send(convID, prompt string) wire.Job {
	f.t.Helper()
	var j wire.Job
	f.user(http.MethodPost, "/v1/conversations/"+convID+"/messages", wire.SendMessageRequest{Prompt: prompt}, &j)
	return j
}

func (f *fixture) job(id string) wire.Job {
	f.t.Helper()
	var j wire.Job
	f.user(http.MethodGet, "/v1/jobs/"+id, nil, &j)
	return j
}

// claim claims the next turn with the fixture's host, without waiting.
func (f *fixture) claim() wire.Claim {
	f.t.Helper()
	c, err := f.wc.Claim(context.Background(), f.hostToken, wire.ClaimRequest{})
	if err != nil {
		f.t.Fatalf("claim: %v", err)
	}
	return c
}

// turn enqueues a turn in a new conversation and claims it.
func (f *fixture) turn() wire.Claim {
	f.t.Helper()
	f.send(f.newConversation().ID, "hello")
	return f.claim()
}

func ref(c wire.Claim) wire.AttemptRef {
	return wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
}

// hasEvent reports whether the job has an event of the given type.
func hasEvent(j wire.Job, typ string) bool {
	for _, e := range j.Events {
		if e.Type == typ {
			return true
		}
	}
	return false
}

func statusOf(err error) (int, string) {
	if se, ok := err.(*wire.StatusError); ok {
		return se.Status, se.Code
	}
	return 0, ""
}
