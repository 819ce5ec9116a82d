package checker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore/sqltest"
	"github.com/runnerd/runnerd/wire"
)

// recording serves h and writes each request and its answer to hist, as
// the campaign's recording hop does: the job from the path, the attempt
// and generation from the body, a claim's from its answer, never a token.
func recording(t *testing.T, hist *Writer, host string, h http.Handler) *httptest.Server {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent := time.Now()
		body, _ := io.ReadAll(io.LimitReader(r.Body, wire.MaxBodyBytes))
		r.Body = io.NopCloser(bytes.NewReader(body))
		call, job := CallOf(r.Method, r.URL.Path)
		rec := Record{Host: host, Replica: "cp", JobID: job, HTTP: &HTTP{Method: r.Method, Path: r.URL.Path, Call: call, Sent: sent}}
		if IsAttemptWrite(call) {
			var ref wire.AttemptRef
			_ = json.Unmarshal(body, &ref)
			rec.AttemptID, rec.LeaseGeneration = ref.AttemptID, ref.LeaseGeneration
		}
		rw := httptest.NewRecorder()
		h.ServeHTTP(rw, r)
		answered := time.Now()
		rec.HTTP.Answered, rec.HTTP.Status = &answered, rw.Code
		switch {
		case call == CallClaim && rw.Code == http.StatusOK:
			var c wire.Claim
			_ = json.Unmarshal(rw.Body.Bytes(), &c)
			rec.JobID, rec.AttemptID, rec.LeaseGeneration, rec.ConversationID = c.JobID, c.AttemptID, c.LeaseGeneration, c.Turn.ConversationID
		case call == CallSendMessage && rw.Code == http.StatusCreated:
			var j wire.Job
			_ = json.Unmarshal(rw.Body.Bytes(), &j)
			rec.JobID, rec.ConversationID = j.ID, j.ConversationID
		case rw.Code >= 300:
			var eb wire.ErrorBody
			_ = json.Unmarshal(rw.Body.Bytes(), &eb)
			rec.HTTP.Code = eb.Code
		}
		if err := hist.Write(rec); err != nil {
			t.Error(err)
		}
		for k, v := range rw.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rw.Code)
		w.Write(rw.Body.Bytes())
	}))
	t.Cleanup(hs.Close)
	return hs
}

// storeClock is the store's clock, moved by hand so that a lease expires
// without the test waiting for it.
type storeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *storeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *storeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestFenceScenario drives the real control plane on a real SQLite store
// through the history a fenced write exists for: host h1 claims a turn and
// falls silent, the reaper supersedes its attempt and requeues the turn,
// host h2 claims it again and runs it to the end — and h1, back, still
// renews and finishes its old attempt. The recorded history goes to the
// checker. The store as built here refuses h1's writes (409) and the
// history is clean; built with -tags chaos_broken_fence (fence_broken.go)
// it accepts them, and the checker must report the stale writes.
// TestBrokenFenceBuildIsCaught runs the second build.
//
// It runs on SQLite, and on PostgreSQL when RUNNERD_TEST_POSTGRES names one
// (the campaign's fleet runs on PostgreSQL, whose worker calls take other
// statements).
func TestFenceScenario(t *testing.T) {
	for _, db := range []struct {
		name string
		open func(testing.TB, ...sqlstore.Option) *sqlstore.Store
	}{{"sqlite", sqltest.SQLite}, {"postgres", sqltest.Postgres}} {
		t.Run(db.name, func(t *testing.T) {
			clock := &storeClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
			fenceScenario(t, db.open(t, sqlstore.WithClock(func(time.Time) time.Time { return clock.now() })), clock)
		})
	}
}

func fenceScenario(t *testing.T, st *sqlstore.Store, clock *storeClock) {
	ctx := context.Background()
	var err error
	srv := controlplane.New(controlplane.Config{Store: st, Now: clock.now, Logger: slog.New(slog.DiscardHandler)})

	var buf bytes.Buffer
	hist := NewWriter(&buf)
	const userTok = "rdu_fence-scenario-user-token-0123456789"
	if _, err := st.CreateUserToken(ctx, "test", controlplane.HashToken(userTok), store.Audit{Actor: "test"}, clock.now()); err != nil {
		t.Fatal(err)
	}
	hostTok := map[string]string{}
	client := map[string]*wire.Client{}
	for _, name := range []string{"", "h1", "h2"} {
		hs := recording(t, hist, name, srv.Handler())
		client[name] = &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
		if name != "" {
			hostTok[name] = controlplane.NewToken(controlplane.HostTokenPrefix)
			if _, err := st.CreateHost(ctx, name, controlplane.HashToken(hostTok[name]), store.Audit{Actor: "test"}, clock.now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	user := func(method, path string, body, out any) {
		t.Helper()
		if _, err := client[""].Do(ctx, method, path, userTok, body, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	var conv wire.Conversation
	user(http.MethodPost, "/v1/conversations", wire.CreateConversationRequest{Image: "demo", AgentCommand: []string{"demo-agent"}}, &conv)
	var job wire.Job
	user(http.MethodPost, "/v1/conversations/"+conv.ID+"/messages", wire.SendMessageRequest{Prompt: "the only turn"}, &job)

	ttl := 40 * time.Second
	c1, err := client["h1"].Claim(ctx, hostTok["h1"], wire.ClaimRequest{LeaseTTLMS: ttl.Milliseconds()})
	if err != nil {
		t.Fatalf("h1 claims: %v", err)
	}
	// h1 falls silent; the reaper sweeps every 5 s of the store's clock
	// until it supersedes the attempt and requeues the turn.
	for i := 0; ; i++ {
		clock.advance(5 * time.Second)
		srv.Sweep(ctx)
		user(http.MethodGet, "/v1/jobs/"+job.ID, nil, &job)
		if job.State == wire.JobQueued {
			break
		}
		if i > 40 {
			t.Fatalf("the reaper never requeued the silent attempt: %+v", job)
		}
	}
	c2, err := client["h2"].Claim(ctx, hostTok["h2"], wire.ClaimRequest{LeaseTTLMS: ttl.Milliseconds()})
	if err != nil || c2.JobID != job.ID || c2.LeaseGeneration <= c1.LeaseGeneration {
		t.Fatalf("h2 claims: %+v, %v", c2, err)
	}

	// h1 is back and writes about its superseded attempt.
	ref1 := wire.AttemptRef{AttemptID: c1.AttemptID, LeaseGeneration: c1.LeaseGeneration}
	_, renewErr := client["h1"].Renew(ctx, c1.WorkerToken, job.ID, wire.RenewRequest{AttemptRef: ref1, LeaseTTLMS: ttl.Milliseconds()})
	_, finishErr := client["h1"].Finish(ctx, c1.WorkerToken, job.ID, wire.FinishRequest{AttemptRef: ref1, Outcome: wire.OutcomeFailed, Class: "agent_exit"})

	// h2 runs the turn to its end.
	ref2 := wire.AttemptRef{AttemptID: c2.AttemptID, LeaseGeneration: c2.LeaseGeneration}
	w2 := client["h2"]
	steps := []error{
		w2.Container(ctx, c2.WorkerToken, job.ID, wire.ContainerRequest{AttemptRef: ref2, Backend: "process", ContainerID: "ws-1"}),
	}
	_, err = w2.Admission(ctx, c2.WorkerToken, job.ID, wire.AdmissionRequest{AttemptRef: ref2, ActivationID: "act-2"})
	steps = append(steps, err)
	_, err = w2.Settlement(ctx, c2.WorkerToken, job.ID, wire.SettlementRequest{AttemptRef: ref2, ActivationID: "act-2",
		Supervisor: wire.SupervisorReceipt{ActivationID: "act-2", ReceiptID: "rcpt-2", NativeTurn: 1}})
	steps = append(steps, err)
	_, err = w2.Finish(ctx, c2.WorkerToken, job.ID, wire.FinishRequest{AttemptRef: ref2, Outcome: wire.OutcomeSucceeded})
	steps = append(steps, err)

	// The end: the job and the conversation as the user API shows them.
	user(http.MethodGet, "/v1/jobs/"+job.ID, nil, &job)
	user(http.MethodGet, "/v1/conversations/"+conv.ID, nil, &conv)
	for _, r := range []Record{{Job: &job}, {Conversation: &conv}} {
		if err := hist.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := hist.Flush(); err != nil {
		t.Fatal(err)
	}
	recs, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	rep := Check(recs)
	t.Logf("build with the broken fence: %v\n%s", brokenFence, rep.Summary())

	if !brokenFence {
		if s, _ := statusOf(renewErr); s != http.StatusConflict {
			t.Errorf("the stale renewal: %v, want 409", renewErr)
		}
		if s, _ := statusOf(finishErr); s != http.StatusConflict {
			t.Errorf("the stale finish: %v, want 409", finishErr)
		}
		for i, err := range steps {
			if err != nil {
				t.Errorf("h2's step %d: %v", i, err)
			}
		}
		if job.State != wire.JobSucceeded || !rep.Clean() {
			t.Fatalf("the fenced store's history: job %s, violations:\n%s", job.State, rep.Summary())
		}
		return
	}
	if renewErr != nil || finishErr != nil {
		t.Errorf("the broken fence refused the stale writes: renew %v, finish %v", renewErr, finishErr)
	}
	if n := rep.Count(StaleWrite); n < 2 || rep.Clean() {
		t.Fatalf("the checker missed the broken fence: %d stale writes\n%s", n, rep.Summary())
	}
}

func statusOf(err error) (int, string) {
	if se, ok := err.(*wire.StatusError); ok {
		return se.Status, se.Code
	}
	return 0, ""
}

// TestBrokenFenceBuildIsCaught builds this package with the store's
// deliberately broken fence and runs TestFenceScenario in it: it passes
// only if the checker reports the stale writes that build accepts. The
// checker proves it can fail.
func TestBrokenFenceBuildIsCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package again with -tags chaos_broken_fence")
	}
	if brokenFence {
		t.Skip("this is the broken build itself")
	}
	gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		if gobin, err = exec.LookPath("go"); err != nil {
			t.Skip("no go command to build the broken fence with")
		}
	}
	cmd := exec.CommandContext(t.Context(), gobin, "test", "-count=1", "-tags", "chaos_broken_fence",
		"-run", "^TestFenceScenario$", "-v", ".")
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the broken build's scenario failed: %v", err)
	}
	for _, want := range []string{"build with the broken fence: true", "stale writes accepted: ", "--- PASS: TestFenceScenario/sqlite"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the broken build's run does not say %q", want)
		}
	}
	if strings.Contains(string(out), "stale writes accepted: 0") {
		t.Fatal("the broken build's history shows no stale write")
	}
}
