package runner

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// The K1 world: the real control-plane handler on a real SQLite store,
// served by a real http.Server over memnet and reached by the daemon's
// real clients (its control transport and its renewal client), all in one
// synctest bubble, so the report policy's pauses run on fake time at their
// real defaults. In front of the handler, like a proxy, a fault handler
// answers planned statuses for chosen operations without reaching it.

const k1URL = "http://controlplane"

// answer is one planned answer of the fault handler; status 0 passes the
// request to the control plane.
type answer struct {
	status     int
	retryAfter string        // the Retry-After header, if any
	hang       bool          // never answer: the client's limit ends the request
	delay      time.Duration // pass, and hold the control plane's answer this long
}

type faultProxy struct {
	next  http.Handler
	start time.Time

	mu     sync.Mutex          // guards the fields below
	plan   map[string][]answer // per op, consumed in order
	always map[string]answer   // per op, once its plan is used up
	tries  map[string][]time.Duration
}

// pick records a try of op and returns its planned answer, if any.
func (p *faultProxy) pick(op string) (answer, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tries[op] = append(p.tries[op], time.Since(p.start))
	a, planned := answer{}, false
	if q := p.plan[op]; len(q) > 0 {
		a, p.plan[op], planned = q[0], q[1:], true
	} else if al, ok := p.always[op]; ok {
		a, planned = al, true
	}
	return a, planned
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == wire.PathWorkerBatch {
		p.serveBatch(w, r)
		return
	}
	a, planned := p.pick(path.Base(r.URL.Path))
	switch {
	case planned && a.hang:
		io.Copy(io.Discard, r.Body) // then the server notices the client leaving
		<-r.Context().Done()
		return
	case planned && a.delay > 0:
		rec := httptest.NewRecorder()
		p.next.ServeHTTP(rec, r)
		time.Sleep(a.delay)
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
		return
	case !planned || a.status == 0:
		p.next.ServeHTTP(w, r)
		return
	}
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	json.NewEncoder(w).Encode(wire.ErrorBody{Code: "injected", Message: "injected by the test's proxy"})
}

// serveBatch plans each item of a worker batch as the per-call request
// it stands for: a planned status is that item's answer, a hang holds
// the whole batch (no item of it is answered), a delay holds the answer,
// and the rest go on, as one batch, to the control plane.
func (p *faultProxy) serveBatch(w http.ResponseWriter, r *http.Request) {
	var req wire.WorkerBatch
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	results := make([]wire.BatchResult, len(req.Items))
	var pass wire.WorkerBatch
	var passed []int
	hang, delay := false, time.Duration(0)
	for i, it := range req.Items {
		a, planned := p.pick(it.Op)
		switch {
		case planned && a.hang:
			hang = true
		case !planned || a.status == 0 || a.delay > 0:
			delay = max(delay, a.delay)
			pass.Items = append(pass.Items, it)
			passed = append(passed, i)
		default:
			body, _ := json.Marshal(wire.ErrorBody{Code: "injected", Message: "injected by the test's proxy"})
			results[i] = wire.BatchResult{Status: a.status, RetryAfter: a.retryAfter, Body: body}
		}
	}
	if hang {
		<-r.Context().Done()
		return
	}
	if len(pass.Items) > 0 {
		b, _ := json.Marshal(pass)
		fwd := httptest.NewRequestWithContext(r.Context(), http.MethodPost, wire.PathWorkerBatch, strings.NewReader(string(b)))
		fwd.Header.Set("Authorization", r.Header.Get("Authorization"))
		rec := httptest.NewRecorder()
		p.next.ServeHTTP(rec, fwd)
		var out wire.WorkerBatchResponse
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil || len(out.Results) != len(passed) {
			maps.Copy(w.Header(), rec.Header())
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		for j, i := range passed {
			results[i] = out.Results[j]
		}
	}
	time.Sleep(delay)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(wire.WorkerBatchResponse{Results: results})
}

func (p *faultProxy) set(op string, plan []answer, always *answer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plan[op] = append(p.plan[op], plan...)
	if always != nil {
		p.always[op] = *always
	} else {
		delete(p.always, op)
	}
}

// triesOf returns when each request of op reached the proxy, since since.
func (p *faultProxy) triesOf(op string, since time.Time) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Duration
	for _, at := range p.tries[op] {
		out = append(out, at-since.Sub(p.start))
	}
	return out
}

type k1World struct {
	t         *testing.T
	st        store.Store
	proxy     *faultProxy
	wc        *wire.Client // straight to the control plane, past the proxy
	hostToken string
	listener  *memnet.Listener // the proxy's: the daemon dials it
}

// newK1World must run inside a bubble; it is closed when the test returns.
func newK1World(t *testing.T) *k1World {
	t.Helper()
	ctx := context.Background()
	st, err := sqlstore.OpenSQLite(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler)})
	w := &k1World{t: t, st: st}
	w.proxy = &faultProxy{next: srv.Handler(), start: time.Now(),
		plan: map[string][]answer{}, always: map[string]answer{}, tries: map[string][]time.Duration{}}
	l := memnet.Listen("controlplane")
	hs := &http.Server{Handler: w.proxy}
	go hs.Serve(l)
	direct := memnet.Listen("direct")
	hsDirect := &http.Server{Handler: srv.Handler()}
	go hsDirect.Serve(direct)
	tr := &http.Transport{DialContext: direct.Dial}
	w.wc = &wire.Client{BaseURL: k1URL, HTTP: &http.Client{Transport: tr}}
	w.hostToken = controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := st.CreateHost(ctx, "host-a", controlplane.HashToken(w.hostToken), store.Audit{Actor: "test"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hs.Close()
		hsDirect.Close()
		tr.CloseIdleConnections()
		st.Close()
	})
	w.listener = l
	return w
}

// daemon builds a Daemon at the default timings whose every request goes
// through the proxy.
func (w *k1World) daemon() (*Daemon, *logBuf) {
	w.t.Helper()
	return w.daemonWith(nil)
}

// daemonWith is daemon with mod applied to its Config.
func (w *k1World) daemonWith(mod func(*Config)) (*Daemon, *logBuf) {
	w.t.Helper()
	dial := w.listener.Dial
	logs := &logBuf{}
	cfg := Config{
		ControlPlaneURL: k1URL,
		HostToken:       w.hostToken,
		HostName:        "host-a",
		StateDir:        w.t.TempDir(),
		Executable:      "/bin/false",
		Transport:       &http.Transport{DialContext: dial},
		Logger:          slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Clock:           boottime.Since(time.Now()), // the bubble's fake time
	}
	cfg.RenewHTTP.DialContext = dial
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	return d, logs
}

// claim enqueues a turn (in a new conversation, or convID) and claims it.
func (w *k1World) claim(convID string) wire.Claim {
	w.t.Helper()
	ctx := context.Background()
	if convID == "" {
		conv, err := w.st.CreateConversation(ctx, wire.CreateConversationRequest{Image: "scratch", AgentCommand: []string{"demoagent"}}, time.Now())
		if err != nil {
			w.t.Fatal(err)
		}
		convID = conv.ID
	}
	if _, err := w.st.EnqueueTurn(ctx, convID, "hello", time.Now()); err != nil {
		w.t.Fatal(err)
	}
	c, err := w.wc.Claim(ctx, w.hostToken, wire.ClaimRequest{LeaseTTLMS: heartbeat.DefaultLeaseTTL.Milliseconds()})
	if err != nil {
		w.t.Fatalf("claim: %v", err)
	}
	return c
}

// turnUpTo plays the turn child's part with the attempt's own token, past
// the proxy: the container record, then the admission and the settlement.
func (w *k1World) turnUpTo(c wire.Claim, stage string) {
	w.t.Helper()
	ctx := context.Background()
	ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
	if stage == "" {
		return
	}
	if err := w.wc.Container(ctx, c.WorkerToken, c.JobID, wire.ContainerRequest{AttemptRef: ref, Backend: "process", ContainerID: "sb-" + c.Turn.ConversationID}); err != nil {
		w.t.Fatalf("container: %v", err)
	}
	if stage == "container" {
		return
	}
	if _, err := w.wc.Admission(ctx, c.WorkerToken, c.JobID, wire.AdmissionRequest{AttemptRef: ref, ActivationID: "act-" + c.AttemptID}); err != nil {
		w.t.Fatalf("admission: %v", err)
	}
	rcpt := wire.SupervisorReceipt{ActivationID: "act-" + c.AttemptID, ReceiptID: "rcpt-" + c.AttemptID, NativeTurn: c.Turn.NativeTurn + 1}
	if _, err := w.wc.Settlement(ctx, c.WorkerToken, c.JobID, wire.SettlementRequest{AttemptRef: ref, ActivationID: rcpt.ActivationID, Supervisor: rcpt}); err != nil {
		w.t.Fatalf("settlement: %v", err)
	}
}

func (w *k1World) job(id string) wire.Job {
	w.t.Helper()
	j, err := w.st.GetJob(context.Background(), id)
	if err != nil {
		w.t.Fatal(err)
	}
	return j
}

// statusesOf lists the statuses of the records named msg about op.
func statusesOf(logs *logBuf, msg, op string) []int {
	var out []int
	for _, line := range strings.Split(logs.String(), "\n") {
		var r struct {
			Msg    string `json:"msg"`
			Op     string `json:"op"`
			Status int    `json:"status"`
		}
		if json.Unmarshal([]byte(line), &r) == nil && r.Msg == msg && r.Op == op {
			out = append(out, r.Status)
		}
	}
	return out
}

// K1: the control plane answers 500, then 429 with Retry-After, then 503 to
// the restart's lease question and then to the terminal report — finish
// after a settled turn, abandon before admission, release of a turn never
// accepted. Each is retried under the report policy at its real default
// pauses while renewal goes on; the report arrives, the job ends as the
// turn did, the conversation stays usable, and the persisted report is
// deleted only then. Every failure is recorded by class and status once per
// change, every pause by a retry record.
func TestK1ReportsSurviveTransientAnswers(t *testing.T) {
	faults := []answer{{status: 500}, {status: 429, retryAfter: "20"}, {status: 503}}
	tests := []struct {
		name     string
		stage    string // how far the turn got before its report
		report   func(ref wire.AttemptRef) settlement.Report
		op       string
		jobState string
		requeued bool
	}{
		{"finish after settlement", "settled", func(ref wire.AttemptRef) settlement.Report {
			return settlement.Report{Finish: &wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeSucceeded}}
		}, wire.OpFinish, wire.JobSucceeded, false},
		{"abandon before admission", "container", func(ref wire.AttemptRef) settlement.Report {
			return settlement.Report{Abandon: &wire.AbandonRequest{AttemptRef: ref, Class: "activation_failed"}}
		}, wire.OpAbandon, wire.JobFailed, false},
		{"release of a turn never accepted", "", func(ref wire.AttemptRef) settlement.Report {
			return settlement.Report{Release: &wire.ReleaseRequest{AttemptRef: ref, Class: "declined:image_missing"}}
		}, wire.OpRelease, wire.JobQueued, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newK1World(t)
				c := w.claim("")
				w.turnUpTo(c, tt.stage)
				d, logs := w.daemon()
				ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
				rep := tt.report(ref)
				if err := d.state.save(record{Claim: c, ClaimedAt: time.Now(), Report: &rep}); err != nil {
					t.Fatal(err)
				}
				w.proxy.set(wire.OpRenew, faults, nil)
				w.proxy.set(tt.op, faults, nil)

				start := time.Now()
				if got := d.recoverOne(context.Background(), mustLoadOne(t, d)); got != decisionResent {
					t.Fatalf("decision %q, want %q", got, decisionResent)
				}
				// The lease question, paced as a renewal (R4): 5 s, then
				// the 20 s the 429 asked for, then 5 s.
				lease := w.proxy.triesOf(wire.OpRenew, start)
				if want := []time.Duration{0, 5 * time.Second, 25 * time.Second, 30 * time.Second}; !slices.Equal(lease[:min(4, len(lease))], want) {
					t.Errorf("lease question tried at %v, want %v first", lease, want)
				}
				// The report from the answered question on: 5 s, the 20 s
				// the 429 asked for (more than the policy's 10 s), 20 s.
				asked := start.Add(30 * time.Second)
				if got, want := w.proxy.triesOf(tt.op, asked), []time.Duration{0, 5 * time.Second, 25 * time.Second, 45 * time.Second}; !slices.Equal(got, want) {
					t.Errorf("%s tried at %v, want %v", tt.op, got, want)
				}
				if got := statusesOf(logs, "agent_control_failure", tt.op); !slices.Equal(got, []int{500, 429, 503}) {
					t.Errorf("%s failure records %v, want one per change: 500, 429, 503", tt.op, got)
				}
				if got := statusesOf(logs, settlement.MsgReportRetry, tt.op); !slices.Equal(got, []int{500, 429, 503}) {
					t.Errorf("%s retry records %v, want one per pause", tt.op, got)
				}
				if n := len(statusesOf(logs, "agent_control_failure", wire.OpRenew)); n != 1 {
					t.Errorf("%d failure records of the lease question's outage, want 1", n)
				}
				if d.state.exists(c.AttemptID) {
					t.Error("the persisted report outlived its acknowledgement")
				}
				if logs.has(MsgReportRefused) {
					t.Errorf("a transient answer was taken for a refusal: %s", logs)
				}

				j := w.job(c.JobID)
				if j.State != tt.jobState {
					t.Fatalf("job %s (%s), want %s", j.State, j.Outcome, tt.jobState)
				}
				conv, err := w.st.GetConversation(context.Background(), c.Turn.ConversationID)
				if err != nil || conv.State != wire.ConversationUsable {
					t.Fatalf("conversation %+v, %v; want usable", conv, err)
				}
				// The conversation takes its next turn (or this one again).
				var next wire.Claim
				if tt.requeued {
					time.Sleep(store.DefaultReleaseBackoff) // K7: a released job waits out its backoff
					next = w.claim2()
				} else {
					next = w.claim(c.Turn.ConversationID)
				}
				if next.Turn.ConversationID != c.Turn.ConversationID || (tt.requeued && next.JobID != c.JobID) {
					t.Fatalf("next claim %+v", next)
				}
				logs.noSecrets(t, c.WorkerToken, w.hostToken)
			})
		})
	}
}

// claim2 claims whatever is queued.
func (w *k1World) claim2() wire.Claim {
	w.t.Helper()
	c, err := w.wc.Claim(context.Background(), w.hostToken, wire.ClaimRequest{LeaseTTLMS: heartbeat.DefaultLeaseTTL.Milliseconds()})
	if err != nil {
		w.t.Fatalf("claim: %v", err)
	}
	return c
}

// K1: a report the control plane refuses with 400 — a request of ours it
// cannot read: no retry changes it, and it is no verdict about the lease —
// is neither retried nor deleted: it stays on disk for a person, with a
// runnerd_report_refused record carrying the operation and the status.
// The same for the restart's lease question.
func TestK1RefusedReportStaysOnDisk(t *testing.T) {
	for _, op := range []string{wire.OpFinish, wire.OpRenew} {
		t.Run(op, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newK1World(t)
				c := w.claim("")
				w.turnUpTo(c, "settled")
				d, logs := w.daemon()
				ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
				rep := settlement.Report{Finish: &wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeSucceeded}}
				if err := d.state.save(record{Claim: c, ClaimedAt: time.Now(), Report: &rep}); err != nil {
					t.Fatal(err)
				}
				w.proxy.set(op, nil, &answer{status: http.StatusBadRequest})
				want := decisionUnsent
				if op == wire.OpRenew {
					want = decisionRefused
				}
				if got := d.recoverOne(context.Background(), mustLoadOne(t, d)); got != want {
					t.Fatalf("decision %q, want %q", got, want)
				}
				if n := len(w.proxy.triesOf(op, time.Time{})); n != 1 {
					t.Errorf("%d tries of a 400, want 1", n)
				}
				if !d.state.exists(c.AttemptID) {
					t.Fatal("a refused report was deleted")
				}
				recs := mustLoadOne(t, d)
				if recs.Report == nil || recs.Report.Finish == nil || recs.Report.Finish.Outcome != wire.OutcomeSucceeded {
					t.Fatalf("kept record %+v, want the report as it was", recs)
				}
				if got := statusesOf(logs, MsgReportRefused, op); !slices.Equal(got, []int{400}) {
					t.Errorf("%s records %v, want one with status 400", MsgReportRefused, got)
				}
				if j := w.job(c.JobID); j.State != wire.JobRunning {
					t.Errorf("job %s, want running (the reaper decides)", j.State)
				}
				logs.noSecrets(t, c.WorkerToken, w.hostToken)
			})
		})
	}
}

// K1: how long a report survives a control plane that answers 503. While
// renewals are acknowledged the report is owed for as long as it takes:
// here 30 minutes of 503s to finish, renewals answered, and then the report
// arrives. When renewals fail too, the report is tried until the local lease
// can no longer be valid — one lease after the last acknowledged renewal
// (R10) — and is then kept on disk for the next start, never deleted.
func TestK1ReportUnderOutage(t *testing.T) {
	t.Run("finish down, renewals answered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := newK1World(t)
			c := w.claim("")
			w.turnUpTo(c, "settled")
			d, logs := w.daemon()
			ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
			rep := settlement.Report{Finish: &wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeSucceeded}}
			if err := d.state.save(record{Claim: c, ClaimedAt: time.Now(), Report: &rep}); err != nil {
				t.Fatal(err)
			}
			w.proxy.set(wire.OpFinish, nil, &answer{status: http.StatusServiceUnavailable})
			start := time.Now()
			done := make(chan string, 1)
			go func() { done <- d.recoverOne(context.Background(), mustLoadOne(t, d)) }()
			time.Sleep(30 * time.Minute)
			tries := w.proxy.triesOf(wire.OpFinish, start)
			if len(tries) < 30 || !d.state.exists(c.AttemptID) {
				t.Fatalf("after 30 minutes: %d finish tries, persisted %v", len(tries), d.state.exists(c.AttemptID))
			}
			for i := 1; i < len(tries); i++ {
				if gap := tries[i] - tries[i-1]; gap > time.Minute {
					t.Fatalf("a pause of %v between tries %d and %d, want at most a minute", gap, i-1, i)
				}
			}
			if renewals := len(w.proxy.triesOf(wire.OpRenew, start)); renewals < 55 {
				t.Errorf("%d renewals in 30 minutes, want one every 30 s", renewals)
			}
			w.proxy.set(wire.OpFinish, nil, nil)
			if got := <-done; got != decisionResent {
				t.Fatalf("decision %q", got)
			}
			if j := w.job(c.JobID); j.State != wire.JobSucceeded {
				t.Fatalf("job %s, want succeeded", j.State)
			}
			if got := statusesOf(logs, "agent_control_failure", wire.OpFinish); !slices.Equal(got, []int{503}) {
				t.Errorf("failure records %v, want one for the whole outage", got)
			}
			t.Logf("finish answered 503 for 30 min: %d tries, the report arrived after %v", len(tries), time.Since(start))
		})
	})
	t.Run("everything down", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := newK1World(t)
			c := w.claim("")
			w.turnUpTo(c, "settled")
			d, logs := w.daemon()
			ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
			rep := settlement.Report{Finish: &wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeSucceeded}}
			if err := d.state.save(record{Claim: c, ClaimedAt: time.Now(), Report: &rep}); err != nil {
				t.Fatal(err)
			}
			// The lease question is answered; from then on everything is 503.
			all := &answer{status: http.StatusServiceUnavailable}
			w.proxy.set(wire.OpRenew, []answer{{}}, all)
			w.proxy.set(wire.OpFinish, nil, all)
			start := time.Now()
			if got := d.recoverOne(context.Background(), mustLoadOne(t, d)); got != decisionUnsent {
				t.Fatalf("decision %q, want %q", got, decisionUnsent)
			}
			survived := time.Since(start)
			tries := w.proxy.triesOf(wire.OpFinish, start)
			if want := []time.Duration{0, 5 * time.Second, 15 * time.Second, 35 * time.Second, 75 * time.Second}; !slices.Equal(tries, want) {
				t.Errorf("finish tried at %v, want %v", tries, want)
			}
			if survived != heartbeat.DefaultLeaseTTL {
				t.Errorf("the report was given up after %v, want one lease (%v) after the last acknowledged renewal", survived, heartbeat.DefaultLeaseTTL)
			}
			if !d.state.exists(c.AttemptID) {
				t.Fatal("the report was deleted without a verdict")
			}
			if !logs.has("agent_lease_expired") {
				t.Errorf("no agent_lease_expired record: %s", logs)
			}
			t.Logf("everything answered 503: %d finish tries at %v, given up %v after the last acknowledged renewal, kept on disk", len(tries), tries, survived)
		})
	})
}

// K1: the restart's lease question is asked for a whole lease, the local
// lease's validity being its context: with every answer 503 it is tried
// every retry delay (R4) and the last try comes within one retry delay of
// the lease's end — not one renewal interval or more before it. Then the
// attempt is kept for the next start, and no record of the whole run
// carries the worker token, the host token, the URL or the request's path.
func TestK1LeaseQuestionAskedForAWholeLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newK1World(t)
		c := w.claim("")
		d, logs := w.daemon()
		if err := d.state.save(record{Claim: c, ClaimedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		w.proxy.set(wire.OpRenew, nil, &answer{status: http.StatusServiceUnavailable})
		start := time.Now()
		if got := d.recoverOne(context.Background(), mustLoadOne(t, d)); got != decisionUnreachable {
			t.Fatalf("decision %q, want %q", got, decisionUnreachable)
		}
		took := time.Since(start)
		lease, delay := heartbeat.DefaultLeaseTTL, heartbeat.DefaultRetryDelay
		tries := w.proxy.triesOf(wire.OpRenew, start)
		if len(tries) == 0 {
			t.Fatal("the lease question was never asked")
		}
		for i := 1; i < len(tries); i++ {
			if gap := tries[i] - tries[i-1]; gap != delay {
				t.Fatalf("tries at %v: a pause of %v, want %v (R4)", tries, gap, delay)
			}
		}
		if last := tries[len(tries)-1]; last < lease-delay || last >= lease {
			t.Errorf("last try at %v, want within one retry delay (%v) of the lease's end (%v); tries %v", last, delay, lease, tries)
		}
		if took > lease {
			t.Errorf("the question was given up after %v, more than a lease (%v)", took, lease)
		}
		if !d.state.exists(c.AttemptID) {
			t.Fatal("the attempt was forgotten without an answer")
		}
		if got := statusesOf(logs, "agent_control_failure", wire.OpRenew); !slices.Equal(got, []int{503}) {
			t.Errorf("failure records %v, want one for the outage", got)
		}
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			for name, s := range map[string]string{"the worker token": c.WorkerToken, "the host token": w.hostToken,
				"the URL": k1URL, "the path": wire.AttemptPath(c.JobID, wire.OpRenew)} {
				if strings.Contains(line, s) {
					t.Errorf("a record carries %s", name)
				}
			}
		}
	})
}
