package controlplane_test

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/wire"
)

// scrapeText fetches url and returns series → value as the text format
// writes them.
func scrapeText(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d %v", url, resp.StatusCode, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// metricsFixture is the fixture's server with its series registered and
// served at /metrics beside the API, as `controlplane serve` does, on a
// SQLite store that reports its transactions.
func metricsFixture(t *testing.T) (*fixture, string) {
	reg := prometheus.NewRegistry()
	m := controlplane.NewMetrics(reg)
	f := &fixture{t: t, clock: &clock{t: time.Now().UTC()}}
	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "cp.db"), sqlstore.WithTxObserver(m.ObserveTx),
		sqlstore.WithClock(func(time.Time) time.Time { return f.clock.Now() }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f.st = st
	f.srv = controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler), Now: f.clock.Now,
		Metrics: m, MinLeaseTTL: time.Second})
	if _, err := st.CreateUserToken(context.Background(), "test", controlplane.HashToken(userToken), store.Audit{Actor: "test"}, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", f.srv.Handler())
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	f.url = hs.URL
	f.wc = &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
	f.hostToken = f.addHost("host-a")
	return f, hs.URL + "/metrics"
}

// The control plane's series move with the worker API as a scrape of the
// real endpoint sees them: hosts by state, jobs by state and live leases
// from the store; claims granted and empty, renewals, finishes, stale
// reports by their answers; request durations by route pattern (never the
// path's ids) and status; store transactions; the reaper's work.
func TestControlPlaneMetricsMove(t *testing.T) {
	f, url := metricsFixture(t)
	ctx := context.Background()
	got := scrapeText(t, url)
	if got["controlplane_store_stats_up"] != 1 || got[`controlplane_hosts{state="offline"}`] != 1 ||
		got[`controlplane_jobs{state="queued"}`] != 0 || got["controlplane_leases_live"] != 0 {
		t.Fatalf("before anything: %v", got)
	}

	if _, err := f.wc.HostHeartbeat(ctx, f.hostToken, wire.HostHeartbeat{Capacity: 2, IntervalMS: 1000}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		f.send(f.newConversation().ID, "p")
	}
	got = scrapeText(t, url)
	if got[`controlplane_hosts{state="online"}`] != 1 || got[`controlplane_hosts{state="offline"}`] != 0 || got[`controlplane_jobs{state="queued"}`] != 3 {
		t.Fatalf("after a heartbeat and three turns: %v", got)
	}

	c, c2 := f.claim(), f.claim()
	f.claim()
	if _, err := f.wc.Claim(ctx, f.hostToken, wire.ClaimRequest{}); err == nil {
		t.Fatal("a fourth claim was granted")
	}
	if _, err := f.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref(c), Outcome: wire.OutcomeFailed, Class: "agent_exit_3",
		Cause: wire.CauseAgentExit, CauseEvidence: "the agent exited 3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err == nil {
		t.Fatal("a finished attempt renewed")
	}
	if err := f.wc.Release(ctx, c2.WorkerToken, c2.JobID, wire.ReleaseRequest{AttemptRef: ref(c2), Class: "declined:test"}); err != nil {
		t.Fatal(err)
	}
	got = scrapeText(t, url)
	for series, want := range map[string]float64{
		`controlplane_claims_total{result="granted"}`:                                                        3,
		`controlplane_claims_total{result="empty"}`:                                                          1,
		`controlplane_renewals_total{status="200"}`:                                                          1,
		`controlplane_finishes_total{op="finish",status="200"}`:                                              1,
		`controlplane_releases_total{status="200"}`:                                                          1,
		`controlplane_stale_reports_total{op="renew"}`:                                                       1,
		`controlplane_jobs{state="failed"}`:                                                                  1,
		`controlplane_jobs_by_cause{cause="agent_exit"}`:                                                     1,
		`controlplane_jobs_by_cause{cause="oom_killed"}`:                                                     0,
		`controlplane_jobs{state="queued"}`:                                                                  1,
		`controlplane_jobs{state="running"}`:                                                                 1,
		"controlplane_leases_live":                                                                           1,
		`controlplane_http_request_duration_seconds_count{route="POST /v1/agent/worker/claim",status="200"}`: 3,
	} {
		if got[series] != want {
			t.Errorf("%s = %v, want %v", series, got[series], want)
		}
	}
	for _, cause := range wire.Causes { // S5: every cause of the closed list is shown, zero included
		if _, ok := got[`controlplane_jobs_by_cause{cause="`+string(cause)+`"}`]; !ok {
			t.Errorf("no controlplane_jobs_by_cause series for %s", cause)
		}
	}
	if n := got[`controlplane_renewals_total{status="409"}`] + got[`controlplane_renewals_total{status="410"}`]; n != 1 {
		t.Errorf("the refused renewal was not counted: %v", got)
	}
	if got[`controlplane_store_tx_duration_seconds_count{result="ok"}`] < 5 {
		t.Errorf("store transactions: %v", got[`controlplane_store_tx_duration_seconds_count{result="ok"}`])
	}
	for series := range got {
		if strings.Contains(series, c.JobID) {
			t.Errorf("a series names a job: %s", series)
		}
	}

	// The third claim's lease runs out; the reaper supersedes it.
	f.clock.Advance(time.Hour)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.srv.RunReaper(rctx) }()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for scrapeText(t, url)[`controlplane_reaped_total{what="superseded"}`] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the reaper's work was not counted: %v", scrapeText(t, url))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := scrapeText(t, url); got[`controlplane_hosts{state="offline"}`] != 1 || got["controlplane_leases_live"] != 0 {
		t.Errorf("an hour later: hosts offline %v, leases %v", got[`controlplane_hosts{state="offline"}`], got["controlplane_leases_live"])
	}
}

// /healthz answers while the process does; /readyz while the database
// answers and its migrations are current, and says which is not.
func TestHealthzAndReadyz(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cp.db")
	f := newFixtureOn(t, database{name: "sqlite", open: func(t testing.TB, opts ...sqlstore.Option) store.Store {
		st, err := sqlstore.OpenSQLite(context.Background(), path, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}})
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := f.do("GET", path, "", ""); code != http.StatusOK {
			t.Fatalf("%s = %d %s", path, code, body)
		}
	}
	// Another process rolls the schema record back, as an older build's
	// database would read.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(),
		`DELETE FROM schema_migrations WHERE name = (SELECT MAX(name) FROM schema_migrations)`); err != nil {
		t.Fatal(err)
	}
	if code, body := f.do("GET", "/readyz", "", ""); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "migrations") {
		t.Fatalf("/readyz with a migration missing = %d %s", code, body)
	}
	f.st.Close()
	if code, body := f.do("GET", "/readyz", "", ""); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "database unreachable") {
		t.Fatalf("/readyz with the database closed = %d %s", code, body)
	}
	if code, _ := f.do("GET", "/healthz", "", ""); code != http.StatusOK {
		t.Fatalf("/healthz with the database closed = %d", code)
	}
}
