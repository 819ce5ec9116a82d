package workerbatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/internal/failover"
	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/internal/workerbatch"
	"github.com/runnerd/runnerd/wire"
)

const hostToken = "rdh_host-SECRET"

// workerToken is job's worker token.
func workerToken(job string) string { return "rdw_" + job + "-SECRET" }

// plane is a simulated control plane's worker API: the batch path (when
// batches is set) and the per-call renew and finish paths, answering
// each call of job with its own lease. A real http.Server on a memnet
// listener serves it.
type plane struct {
	batches bool
	// hold, when set, is waited for by every item (or per-call request)
	// of a job it names before it is answered.
	hold map[string]chan struct{}
	// status, when set, is the whole batch request's answer.
	status int

	mu       sync.Mutex // guards requests
	requests []string   // "batch:<job>,<job>" or "call:<job>/<op>", in arrival order
}

func (p *plane) log(s string) {
	p.mu.Lock()
	p.requests = append(p.requests, s)
	p.mu.Unlock()
}

func (p *plane) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.requests...)
}

// answer is the per-call answer of job's op: what the real control plane
// would say, the job named so that each caller can tell its own.
func (p *plane) answer(ctx context.Context, job, op, auth string) (int, any) {
	if auth != "Bearer "+workerToken(job) {
		return http.StatusUnauthorized, wire.ErrorBody{Code: wire.CodeUnauthorized}
	}
	if h := p.hold[job]; h != nil {
		select {
		case <-h:
		case <-ctx.Done():
			return http.StatusServiceUnavailable, wire.ErrorBody{Code: wire.CodeInternal}
		}
	}
	if op == wire.OpFinish {
		return http.StatusConflict, wire.ErrorBody{Code: wire.CodeLeaseLost, Message: "job " + job}
	}
	return http.StatusOK, wire.RenewResponse{LeaseExpiresAt: time.Now().Add(time.Minute), LeaseTTLMS: 60_000, CancelRequested: job == "cancelled"}
}

func (p *plane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == wire.PathWorkerBatch {
		if !p.batches {
			p.log("batch:404")
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(wire.ErrorBody{Code: wire.CodeNotFound})
			return
		}
		var req wire.WorkerBatch
		if r.Header.Get("Authorization") != "Bearer "+hostToken || json.NewDecoder(r.Body).Decode(&req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		var jobs []string
		for _, it := range req.Items {
			jobs = append(jobs, it.JobID)
		}
		p.log("batch:" + strings.Join(jobs, ","))
		if p.status != 0 {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(p.status)
			json.NewEncoder(w).Encode(wire.ErrorBody{Code: wire.CodeInternal})
			return
		}
		out := make([]wire.BatchResult, len(req.Items))
		var wg sync.WaitGroup
		for i, it := range req.Items {
			wg.Go(func() {
				status, body := p.answer(r.Context(), it.JobID, it.Op, "Bearer "+it.WorkerToken)
				b, _ := json.Marshal(body)
				out[i] = wire.BatchResult{Status: status, Body: b}
			})
		}
		wg.Wait()
		json.NewEncoder(w).Encode(wire.WorkerBatchResponse{Results: out})
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, strings.TrimSuffix(wire.AttemptPath("", ""), "/"))
	job, op, _ := strings.Cut(rest, "/")
	p.log("call:" + job + "/" + op)
	status, body := p.answer(r.Context(), job, op, r.Header.Get("Authorization"))
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// world is one bubble's control plane and a client whose transport is
// the batching one.
type world struct {
	p  *plane
	tr *workerbatch.Transport
	wc *wire.Client
}

func newWorld(t *testing.T, p *plane) *world {
	l := memnet.Listen("cp.test")
	srv := &http.Server{Handler: p}
	go srv.Serve(l)
	base := &http.Transport{DialContext: l.Dial}
	tr := workerbatch.New(base, func() string { return hostToken })
	t.Cleanup(func() {
		srv.Close()
		base.CloseIdleConnections()
	})
	return &world{p: p, tr: tr, wc: &wire.Client{BaseURL: "http://cp.test", HTTP: &http.Client{Transport: tr}}}
}

func (w *world) renew(ctx context.Context, job string) (wire.RenewResponse, error) {
	return w.wc.Renew(ctx, workerToken(job), job, wire.RenewRequest{AttemptRef: wire.AttemptRef{AttemptID: "att-" + job, LeaseGeneration: 1}})
}

// renewAll renews each job on its own goroutine and returns their answers
// once all are in.
func (w *world) renewAll(ctx context.Context, jobs ...string) func() map[string]error {
	errs := make(map[string]error)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			_, err := w.renew(ctx, j)
			mu.Lock()
			errs[j] = err
			mu.Unlock()
		})
	}
	return func() map[string]error { wg.Wait(); return errs }
}

func equal(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// A call made while nothing is in flight is sent at once, a batch of one
// (no time passes before it goes), and its caller gets the per-call
// answer: the status and body the call's own endpoint gives.
func TestIdleCallIsSentAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &plane{batches: true})
		start := time.Now()
		got, err := w.wc.Renew(t.Context(), workerToken("cancelled"), "cancelled", wire.RenewRequest{AttemptRef: wire.AttemptRef{AttemptID: "a", LeaseGeneration: 1}})
		if err != nil || !got.CancelRequested || got.LeaseTTLMS != 60_000 {
			t.Fatalf("renewal through a batch of one: %+v, %v", got, err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("an idle call waited %v before its answer", d)
		}
		_, err = w.wc.Finish(t.Context(), workerToken("j1"), "j1", wire.FinishRequest{AttemptRef: wire.AttemptRef{AttemptID: "a", LeaseGeneration: 1}, Outcome: wire.OutcomeFailed})
		var se *wire.StatusError
		if !errors.As(err, &se) || se.Status != http.StatusConflict || se.Code != wire.CodeLeaseLost || se.Message != "job j1" {
			t.Fatalf("a refused finish through a batch: %v, want the per-call 409 lease_lost", err)
		}
		if s := w.p.seen(); !equal(s, []string{"batch:cancelled", "batch:j1"}) || w.tr.Batches() != 2 {
			t.Fatalf("requests %v, want one batch of one per call", s)
		}
		// A call the batch does not carry goes as it is.
		if _, err := w.wc.Claim(t.Context(), hostToken, wire.ClaimRequest{}); err == nil {
			t.Fatal("a claim was answered by the batch path")
		}
	})
}

// Calls made while a batch is in flight wait for it and go together in
// the next batch request as soon as it returns; each caller gets its own
// answer.
func TestCallsWhileInFlightGoInTheNextBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		w := newWorld(t, &plane{batches: true, hold: map[string]chan struct{}{"first": gate}})
		first := w.renewAll(t.Context(), "first")
		synctest.Wait() // the first batch is in flight, held
		rest := w.renewAll(t.Context(), "j1", "j2", "j3", "j4", "j5")
		synctest.Wait() // all five queued behind it
		if s := w.p.seen(); !equal(s, []string{"batch:first"}) {
			t.Fatalf("requests while the first is in flight: %v, want only it", s)
		}
		close(gate)
		if errs := first(); errs["first"] != nil {
			t.Fatalf("first: %v", errs["first"])
		}
		for j, err := range rest() {
			if err != nil {
				t.Fatalf("%s: %v", j, err)
			}
		}
		s := w.p.seen()
		if len(s) != 2 || !strings.HasPrefix(s[1], "batch:") || len(strings.Split(s[1], ",")) != 5 {
			t.Fatalf("requests %v, want the first batch then one of the five", s)
		}
	})
}

// A caller whose context ends while its call is queued is taken out of
// the queue and gets its context's error at that instant; it is never
// sent. One whose context ends after its call was sent gets the error at
// once too, and the batch goes on for the others.
func TestQueuedCallerDeadlineRemovesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		w := newWorld(t, &plane{batches: true, hold: map[string]chan struct{}{"first": gate}})
		first := w.renewAll(t.Context(), "first")
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err := w.renew(ctx, "late")
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 3*time.Second {
			t.Fatalf("queued caller: %v after %v, want its deadline's error at 3s", err, time.Since(start))
		}
		kept := w.renewAll(t.Context(), "kept")
		synctest.Wait()
		close(gate)
		first()
		if errs := kept(); errs["kept"] != nil {
			t.Fatalf("kept: %v", errs["kept"])
		}
		if s := w.p.seen(); !equal(s, []string{"batch:first", "batch:kept"}) {
			t.Fatalf("requests %v: the caller that left was sent", s)
		}

		// Sent, then the caller's deadline: its error at once, as a timeout.
		hold := make(chan struct{})
		w.p.hold["slow"] = hold
		ctx2, cancel2 := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel2()
		start = time.Now()
		_, err = w.renew(ctx2, "slow")
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 10*time.Second {
			t.Fatalf("sent caller: %v after %v, want its deadline's error at 10s", err, time.Since(start))
		}
		close(hold)
	})
}

// A control plane that answers the batch path 404 predates it: the call
// is sent per call at once, and every later call goes per call for good.
func TestOlderControlPlaneFallsBackToPerCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &plane{batches: false})
		for _, j := range []string{"j1", "j2", "j3"} {
			if _, err := w.renew(t.Context(), j); err != nil {
				t.Fatalf("%s: %v", j, err)
			}
		}
		want := []string{"batch:404", "call:j1/renew", "call:j2/renew", "call:j3/renew"}
		if s := w.p.seen(); !equal(s, want) || w.tr.Batches() != 1 {
			t.Fatalf("requests %v, want %v", s, want)
		}
	})
}

// A batch answered 503 with a Retry-After gives each call that answer,
// as its own request would have: the caller's retry policy reads it.
func TestBatchFailureIsEachCallsAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(t, &plane{batches: true, status: http.StatusServiceUnavailable})
		_, err := w.renew(t.Context(), "j1")
		var se *wire.StatusError
		if !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable || se.RetryAfter != 7*time.Second {
			t.Fatalf("renewal in a failed batch: %v, want 503 with Retry-After 7s", err)
		}
	})
}

// Under failover's transport, a batch that gets no answer from the
// address in use fails each of its calls there, which moves the next
// calls, and their batch, to the next address.
func TestBatchesFollowFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memnet.Listen("a.test"), memnet.Listen("b.test")
		pa, pb := &plane{batches: true}, &plane{batches: true}
		for l, p := range map[*memnet.Listener]*plane{a: pa, b: pb} {
			srv := &http.Server{Handler: p}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
		}
		a.SetRefusing(true)
		base := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if strings.HasPrefix(addr, "a.test") {
				return a.Dial(ctx, network, addr)
			}
			return b.Dial(ctx, network, addr)
		}}
		t.Cleanup(base.CloseIdleConnections)
		ep, err := failover.Parse("http://a.test,http://b.test")
		if err != nil {
			t.Fatal(err)
		}
		ep.SetProbeEvery(time.Hour)
		wc := &wire.Client{BaseURL: ep.Base(), HTTP: &http.Client{Transport: ep.Transport(workerbatch.New(base, func() string { return hostToken }))}}
		call := func(job string) error {
			_, err := wc.Renew(t.Context(), workerToken(job), job, wire.RenewRequest{AttemptRef: wire.AttemptRef{AttemptID: "a", LeaseGeneration: 1}})
			return err
		}
		if err := call("j1"); err == nil {
			t.Fatal("a call to a refusing address was answered")
		}
		if err := call("j2"); err != nil {
			t.Fatalf("the next call, after failover: %v", err)
		}
		if s := pb.seen(); !equal(s, []string{"batch:j2"}) || len(pa.seen()) != 0 {
			t.Fatalf("b saw %v, a %v; want j2's batch at b", s, pa.seen())
		}
	})
}

// A job whose call was sent in a batch and got no answer in its caller's
// time goes on its own from then on, until it is answered: a job stuck at
// the control plane holds the other jobs' calls behind it once at most.
func TestStuckJobGoesAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stuck := make(chan struct{})
		w := newWorld(t, &plane{batches: true, hold: map[string]chan struct{}{"stuck": stuck}})
		try := func() map[string]error {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			return w.renewAll(ctx, "stuck", "j1", "j2")()
		}
		if errs := try(); errs["stuck"] == nil {
			t.Fatalf("the stuck job was answered: %v", errs)
		}
		start, before := time.Now(), len(w.p.seen())
		errs := try()
		if errs["j1"] != nil || errs["j2"] != nil || errs["stuck"] == nil {
			t.Fatalf("second try: %v, want j1 and j2 answered past the stuck job", errs)
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Fatalf("second try took %v (the stuck job's own limit)", d)
		}
		for _, r := range w.p.seen()[before:] { // the second try's requests
			if strings.Contains(r, "stuck") && r != "call:stuck/renew" {
				t.Fatalf("requests %v: the stuck job went in a batch again", w.p.seen())
			}
		}
		close(stuck)
		if _, err := w.renew(t.Context(), "stuck"); err != nil {
			t.Fatal(err)
		}
		if _, err := w.renew(t.Context(), "stuck"); err != nil {
			t.Fatal(err)
		}
		if s := w.p.seen(); s[len(s)-2] != "call:stuck/renew" || s[len(s)-1] != "batch:stuck" {
			t.Fatalf("requests %v: once answered on its own, the job's next call goes in a batch again", s)
		}
	})
}
