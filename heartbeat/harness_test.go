package heartbeat_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/internal/workerbatch"
	"github.com/runnerd/runnerd/wire"
)

// Values that must never reach a record.
const (
	token    = "wtok-SECRET-7f3a9c"
	bodyText = "BODY-TEXT-do-not-log"
	host     = "renew.test"
	jobID    = "job-1"
)

// reply is what the simulated lease endpoint does with one renewal.
type reply struct {
	status int           // non-2xx status with an error body; 0 = answer 200
	hang   bool          // never answer; wait until the client gives up
	drop   bool          // close the connection without an answer
	delay  time.Duration // answer 200 after this long
	cancel bool          // cancel_requested in the answer (P7)
	ttl    time.Duration // lease_ttl_ms in the answer; 0 = the requested one
}

// policy decides the reply to the n-th renewal (from 1) of a job, arriving
// at offset at after the claim.
type policy func(job string, n int, at time.Duration) reply

func ok(string, int, time.Duration) reply { return reply{} }

// hangFrom answers until from, and hangs on every request arriving later.
func hangFrom(from time.Duration) policy {
	return func(_ string, _ int, at time.Duration) reply { return reply{hang: at >= from} }
}

// recoverAt hangs on every request arriving before at and answers from it on.
func recoverAt(at time.Duration) policy {
	return func(_ string, _ int, t time.Duration) reply { return reply{hang: t < at} }
}

// endpoint is the simulated control plane's renew handler: a real
// http.Handler that checks what a real one checks.
type endpoint struct {
	t0     time.Time
	policy policy
	// release ends hanging handlers when the test is over.
	release chan struct{}

	mu    sync.Mutex
	sends map[string][]time.Duration
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Since(e.t0)
	var job string // jobID, job-2, or one of job-b1…job-b9
	for _, j := range []string{jobID, "job-2", "job-b1", "job-b2", "job-b3", "job-b4", "job-b5", "job-b6", "job-b7", "job-b8", "job-b9"} {
		if r.URL.Path == wire.AttemptPath(j, wire.OpRenew) {
			job = j
		}
	}
	var req wire.RenewRequest
	if r.Method != http.MethodPost || job == "" || r.Header.Get("Authorization") != "Bearer "+token ||
		json.NewDecoder(io.LimitReader(r.Body, wire.MaxBodyBytes)).Decode(&req) != nil ||
		req.AttemptID != "att-"+job || req.LeaseGeneration != 7 || req.LeaseTTLMS <= 0 {
		w.WriteHeader(http.StatusBadRequest) // the test will see http_400 and fail
		return
	}
	e.mu.Lock()
	e.sends[job] = append(e.sends[job], at)
	n := len(e.sends[job])
	e.mu.Unlock()

	rp := e.policy(job, n, at)
	switch {
	case rp.hang:
		select {
		case <-r.Context().Done():
		case <-e.release:
		}
		return
	case rp.drop:
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
		return
	case rp.status != 0:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rp.status)
		json.NewEncoder(w).Encode(wire.ErrorBody{Code: "lease_lost", Message: bodyText + " " + token})
		return
	}
	time.Sleep(rp.delay)
	ttl := rp.ttl
	if ttl == 0 {
		ttl = time.Duration(req.LeaseTTLMS) * time.Millisecond
	}
	json.NewEncoder(w).Encode(wire.RenewResponse{
		LeaseExpiresAt:  time.Now().Add(ttl),
		LeaseTTLMS:      ttl.Milliseconds(),
		CancelRequested: rp.cancel,
	})
}

func (e *endpoint) sent(job string) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.sends[job])
}

// env is one bubble's world: a real http.Server with the endpoint on a
// memnet listener, the renewal client from NewHTTPClient dialling it, and a
// slog handler capturing every record. Create it inside the bubble.
type env struct {
	t    *testing.T
	t0   time.Time
	l    *memnet.Listener
	ep   *endpoint
	srv  *http.Server
	hc   *http.Client
	wc   *wire.Client
	logs *capture
}

func newEnv(t *testing.T, p policy) *env {
	e := &env{t: t, t0: time.Now(), l: memnet.Listen(host), logs: &capture{}}
	e.ep = &endpoint{t0: e.t0, policy: p, release: make(chan struct{}), sends: map[string][]time.Duration{}}
	e.srv = &http.Server{Handler: e.ep}
	go e.srv.Serve(e.l)
	e.hc = heartbeat.NewHTTPClient(heartbeat.HTTPConfig{DialContext: e.l.Dial})
	e.wc = &wire.Client{BaseURL: "http://" + host, HTTP: e.hc}
	t.Cleanup(func() {
		close(e.ep.release)
		e.srv.Close()
		e.hc.CloseIdleConnections()
	})
	return e
}

func (e *env) config() heartbeat.Config {
	return heartbeat.Config{Client: e.wc, Logger: slog.New(e.logs), Clock: e.clock()}
}

// attempt is job's attempt, claimed at the bubble's start.
func (e *env) attempt(job string) heartbeat.Attempt {
	return heartbeat.Attempt{JobID: job, AttemptID: "att-" + job, LeaseGeneration: 7, WorkerToken: token, ClaimSent: e.t0}
}

func (e *env) start(cfg heartbeat.Config, a heartbeat.Attempt) *heartbeat.Renewer {
	r := heartbeat.Start(cfg, a)
	e.t.Cleanup(func() { r.Stop(); <-r.Done() })
	return r
}

// clock counts the lease on the bubble's fake time.
func (e *env) clock() boottime.Since { return boottime.Since(e.t0) }

// at is the instant d after the claim on the bubble's clock.
func (e *env) at(d time.Duration) boottime.Instant { return boottime.FromTime(e.clock(), e.t0.Add(d)) }

// since is the fake time elapsed since the claim.
func (e *env) since() time.Duration { return time.Since(e.t0) }

func secs(ss ...float64) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

// every returns from, from+step, … up to and including to.
func every(from, step, to float64) []float64 {
	var out []float64
	for s := from; s <= to; s += step {
		out = append(out, s)
	}
	return out
}

// record is one captured slog record, flattened.
type record struct {
	Msg   string
	Attrs map[string]any
}

// capture is a slog.Handler that keeps every record.
type capture struct {
	mu   sync.Mutex
	recs []record
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }

func (c *capture) Handle(_ context.Context, r slog.Record) error {
	rec := record{Msg: r.Message, Attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Any()
		return true
	})
	c.mu.Lock()
	c.recs = append(c.recs, rec)
	c.mu.Unlock()
	return nil
}

func (c *capture) WithAttrs(as []slog.Attr) slog.Handler {
	return &captureView{c: c, with: as}
}

func (c *capture) WithGroup(string) slog.Handler { return c }

type captureView struct {
	c    *capture
	with []slog.Attr
}

func (v *captureView) Enabled(context.Context, slog.Level) bool { return true }
func (v *captureView) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(v.with...)
	return v.c.Handle(ctx, r)
}
func (v *captureView) WithAttrs(as []slog.Attr) slog.Handler {
	return &captureView{c: v.c, with: append(slices.Clone(v.with), as...)}
}
func (v *captureView) WithGroup(string) slog.Handler { return v }

func (c *capture) all() []record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

func (c *capture) named(msg string) []record {
	var out []record
	for _, r := range c.all() {
		if r.Msg == msg {
			out = append(out, r)
		}
	}
	return out
}

func (c *capture) names() []string {
	var out []string
	for _, r := range c.all() {
		out = append(out, r.Msg)
	}
	return out
}

// batchedEnv is newEnv with the daemon's batching transport in the
// renewal client's path, the endpoint behind a worker batch path that
// hands each item to it as the per-call request it stands for.
func batchedEnv(t *testing.T, p policy) (*env, *workerbatch.Transport) {
	e := newEnv(t, p)
	e.srv.Handler = unbatch{e.ep}
	tr := workerbatch.New(e.hc.Transport, func() string { return "host-token" })
	e.hc.Transport = tr
	return e, tr
}

// unbatch serves wire.PathWorkerBatch by handing every item to next as
// its per-call request, all at once, and answering their answers.
type unbatch struct{ next http.Handler }

func (u unbatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != wire.PathWorkerBatch {
		u.next.ServeHTTP(w, r)
		return
	}
	var req wire.WorkerBatch
	if r.Header.Get("Authorization") != "Bearer host-token" || json.NewDecoder(r.Body).Decode(&req) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	out := make([]wire.BatchResult, len(req.Items))
	var wg sync.WaitGroup
	for i, it := range req.Items {
		wg.Go(func() {
			ir := httptest.NewRequestWithContext(r.Context(), http.MethodPost, wire.AttemptPath(it.JobID, it.Op), bytes.NewReader(it.Body))
			ir.Header.Set("Authorization", "Bearer "+it.WorkerToken)
			rec := httptest.NewRecorder()
			u.next.ServeHTTP(rec, ir)
			out[i] = wire.BatchResult{Status: rec.Code, RetryAfter: rec.Header().Get("Retry-After"), Body: bytes.TrimSpace(rec.Body.Bytes())}
		})
	}
	wg.Wait()
	if r.Context().Err() != nil {
		return // the daemon gave up on this batch
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(wire.WorkerBatchResponse{Results: out})
}
