package settlement_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/internal/syncbuf"
	"github.com/runnerd/runnerd/settlement"
	"github.com/runnerd/runnerd/wire"
)

// The world of these tests: the real control-plane handler on a real
// SQLite store, served by a real http.Server over memnet, reached by real
// http.Clients — all inside one synctest bubble, so fake time drives every
// timeout and wait. Between the client and the handler sits an injector
// that, on command, fails, hangs or loses answers, and logs every request.

const baseURL = "http://controlplane"

// fault is what the injector does with one request.
type fault struct {
	status int  // answer this status (with its wire code) without reaching the handler
	hang   bool // never answer: the client's try timeout ends the request
	lose   bool // pass the request to the handler (it commits), then drop the connection unanswered
}

var (
	pass      = fault{}
	hang      = fault{hang: true}
	lose      = fault{lose: true}
	leaseLost = fault{status: http.StatusConflict}
)

func status(code int) fault { return fault{status: code} }

// hit is one request as the injector saw it.
type hit struct {
	op        string
	attemptID string
	at        time.Duration // fake time since the world began
	reached   bool          // the real handler processed it
	delivered int           // status the client received; 0 when none
	code      string        // the wire code of a delivered error
	body      []byte
}

type injector struct {
	next  http.Handler
	start time.Time

	mu     sync.Mutex
	plan   map[string][]fault // per op, consumed in order
	always map[string]fault   // per op, once the plan is used up
	any    []fault            // for every op, consumed before plan and always
	hits   []hit
	onHit  func(hit) // called with each hit, under no lock, before it is served
}

func (in *injector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, wire.MaxBodyBytes))
	r.Body = io.NopCloser(bytes.NewReader(body))
	var ref wire.AttemptRef
	_ = json.Unmarshal(body, &ref)
	op := path.Base(r.URL.Path)

	in.mu.Lock()
	f := pass
	switch {
	case len(in.any) > 0:
		f, in.any = in.any[0], in.any[1:]
	case len(in.plan[op]) > 0:
		f = in.plan[op][0]
		in.plan[op] = in.plan[op][1:]
	default:
		if a, ok := in.always[op]; ok {
			f = a
		}
	}
	i := len(in.hits)
	in.hits = append(in.hits, hit{op: op, attemptID: ref.AttemptID, at: time.Since(in.start), body: body})
	onHit := in.onHit
	h := in.hits[i]
	in.mu.Unlock()
	if onHit != nil {
		onHit(h)
	}

	switch {
	case f.hang:
		<-r.Context().Done()
	case f.status != 0:
		code := map[int]string{409: wire.CodeLeaseLost, 410: wire.CodeGone, 401: wire.CodeUnauthorized,
			403: wire.CodeForbidden, 404: wire.CodeNotFound, 400: wire.CodeInvalid}[f.status]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		json.NewEncoder(w).Encode(wire.ErrorBody{Code: code, Message: "injected"})
		in.set(i, false, f.status, code)
	case f.lose:
		rec := httptest.NewRecorder()
		in.next.ServeHTTP(rec, r)
		in.set(i, true, 0, "")
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	default:
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		in.next.ServeHTTP(sw, r)
		var eb wire.ErrorBody
		if sw.status >= 300 {
			json.Unmarshal(sw.body.Bytes(), &eb)
		}
		in.set(i, true, sw.status, eb.Code)
	}
}

func (in *injector) set(i int, reached bool, delivered int, code string) {
	in.mu.Lock()
	in.hits[i].reached, in.hits[i].delivered, in.hits[i].code = reached, delivered, code
	in.mu.Unlock()
}

type statusWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (s *statusWriter) Write(p []byte) (int, error) {
	s.body.Write(p)
	return s.ResponseWriter.Write(p)
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Plan queues faults for the next requests of op.
func (in *injector) Plan(op string, fs ...fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.plan == nil {
		in.plan = map[string][]fault{}
	}
	in.plan[op] = append(in.plan[op], fs...)
}

// Always applies f to every request of op once its plan is used up.
func (in *injector) Always(op string, f fault) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.always == nil {
		in.always = map[string]fault{}
	}
	in.always[op] = f
}

// Hits returns the requests seen so far, optionally only those of op.
func (in *injector) Hits(op string) []hit {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []hit
	for _, h := range in.hits {
		if op == "" || h.op == op {
			out = append(out, h)
		}
	}
	return out
}

// world is one control plane with one host, inside the current bubble.
type world struct {
	t         *testing.T
	st        store.Store
	in        *injector
	l         *memnet.Listener
	hs        *http.Server
	tr        *http.Transport
	wc        *wire.Client
	hostToken string
	logs      *syncbuf.Buffer
	log       *slog.Logger
}

// newWorld must be called inside a synctest bubble; it is closed when the
// test function returns.
func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	st, err := sqlstore.OpenSQLite(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	w := &world{t: t, st: st, logs: &syncbuf.Buffer{}}
	w.log = slog.New(slog.NewJSONHandler(w.logs, nil))
	srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler)})
	w.in = &injector{next: srv.Handler(), start: time.Now()}
	w.l = memnet.Listen("controlplane")
	w.hs = &http.Server{Handler: w.in, ErrorLog: nil}
	go w.hs.Serve(w.l)
	w.tr = &http.Transport{DialContext: w.l.Dial}
	w.wc = &wire.Client{BaseURL: baseURL, HTTP: &http.Client{Transport: w.tr}}
	w.hostToken = controlplane.NewToken(controlplane.HostTokenPrefix)
	if _, err := st.CreateHost(ctx, "host-a", controlplane.HashToken(w.hostToken), store.Audit{Actor: "test"}, time.Now()); err != nil {
		t.Fatalf("create host: %v", err)
	}
	t.Cleanup(w.close)
	return w
}

func (w *world) close() {
	w.hs.Close()
	w.tr.CloseIdleConnections()
	w.st.Close()
}

// turn creates a conversation (or uses convID), enqueues a turn and claims it.
func (w *world) turn(convID, prompt string) wire.Claim {
	w.t.Helper()
	ctx := context.Background()
	if convID == "" {
		conv, err := w.st.CreateConversation(ctx, wire.CreateConversationRequest{Image: "demo", AgentCommand: []string{"demo-agent"}}, time.Now())
		if err != nil {
			w.t.Fatalf("create conversation: %v", err)
		}
		convID = conv.ID
	}
	if _, err := w.st.EnqueueTurn(ctx, convID, prompt, time.Now()); err != nil {
		w.t.Fatalf("enqueue: %v", err)
	}
	c, err := w.wc.Claim(ctx, w.hostToken, wire.ClaimRequest{})
	if err != nil {
		w.t.Fatalf("claim: %v", err)
	}
	return c
}

// claimNone asserts that nothing is claimable.
func (w *world) claimNone() {
	w.t.Helper()
	if c, err := w.wc.Claim(context.Background(), w.hostToken, wire.ClaimRequest{}); !errors.Is(err, wire.ErrNoClaim) {
		w.t.Errorf("claim = job %q, %v; want nothing to claim", c.JobID, err)
	}
}

// session opens a Session for c through the injector.
func (w *world) session(c wire.Claim, mod ...func(*settlement.Config)) *settlement.Session {
	w.t.Helper()
	cfg := settlement.Config{
		BaseURL:     baseURL,
		Transport:   w.tr,
		WorkerToken: c.WorkerToken,
		JobID:       c.JobID,
		Attempt:     wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration},
		Prompt:      c.Turn.Prompt,
		Logger:      w.log,
	}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := settlement.New(cfg)
	if err != nil {
		w.t.Fatalf("new session: %v", err)
	}
	w.t.Cleanup(func() { s.Close() })
	return s
}

func (w *world) job(id string) wire.Job {
	w.t.Helper()
	j, err := w.st.GetJob(context.Background(), id)
	if err != nil {
		w.t.Fatalf("get job: %v", err)
	}
	return j
}

func (w *world) conversation(id string) wire.Conversation {
	w.t.Helper()
	c, err := w.st.GetConversation(context.Background(), id)
	if err != nil {
		w.t.Fatalf("get conversation: %v", err)
	}
	return c
}

// records returns the JSON records with message msg.
func (w *world) records(msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(w.logs.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// agent stands in for the sandbox: it counts prompts and settles with a
// receipt it keeps for its activation (R26), or forgets it (R28).
type agent struct {
	mu        sync.Mutex
	prompts   []string
	settles   int
	activated string
	forgot    bool // the supervisor restarted: the activation is unknown
}

func (a *agent) run(_ context.Context, prompt string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.prompts = append(a.prompts, prompt)
	return "turn-1", nil
}

func (a *agent) settle(context.Context) (wire.SupervisorReceipt, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settles++
	if a.forgot {
		return wire.SupervisorReceipt{}, errors.New("activation unknown to the supervisor")
	}
	return wire.SupervisorReceipt{ActivationID: a.activated, ReceiptID: "rcpt-" + a.activated, NativeTurn: 1}, nil
}

func (a *agent) promptCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.prompts)
}
