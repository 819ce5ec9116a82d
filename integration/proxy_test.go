package integration

import (
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// proxy is a TCP proxy between a daemon (and its turn children) and the
// control plane that can be told to black-hole: from then on it reads what
// it is sent and answers nothing, on the connections already open and on
// new ones, like a network path that silently drops packets. Lifting the
// black hole forwards new connections again; the held ones stay dead, as
// they would behind a real outage.
type proxy struct {
	ln     net.Listener
	target string
	holed  atomic.Bool

	mu    sync.Mutex
	pairs map[*pair]struct{}
	wg    sync.WaitGroup
}

type pair struct {
	client, up net.Conn
	holed      atomic.Bool
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, pairs: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the base address the daemon is given.
func (p *proxy) URL() string { return "http://" + p.ln.Addr().String() }

// blackhole starts (true) or lifts (false) the black hole.
func (p *proxy) blackhole(on bool) {
	p.holed.Store(on)
	if !on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		if pr.up != nil && !pr.holed.Swap(true) {
			pr.up.Close()
		}
	}
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pr := &pair{client: c}
		if p.holed.Load() {
			pr.holed.Store(true)
		} else if up, err := net.Dial("tcp", p.target); err == nil {
			pr.up = up
		} else {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.pairs[pr] = struct{}{}
		if p.holed.Load() && pr.up != nil && !pr.holed.Swap(true) {
			pr.up.Close() // black-holed while it was being dialled
		}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.clientToUp(pr)
		go p.upToClient(pr)
	}
}

func (p *proxy) clientToUp(pr *pair) {
	defer p.wg.Done()
	if pr.up != nil {
		_, _ = io.Copy(pr.up, pr.client)
	}
	if pr.holed.Load() {
		// Swallow whatever the client still sends, answer nothing.
		_, _ = io.Copy(io.Discard, pr.client)
	}
	pr.client.Close()
	if pr.up != nil {
		pr.up.Close()
	}
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

func (p *proxy) upToClient(pr *pair) {
	defer p.wg.Done()
	if pr.up == nil {
		return
	}
	_, _ = io.Copy(pr.client, pr.up)
	if !pr.holed.Load() {
		pr.client.Close() // the server closed: pass it on
	}
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for pr := range p.pairs {
		pr.client.Close()
		if pr.up != nil {
			pr.up.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// faultProxy is an HTTP reverse proxy between a daemon and the control
// plane that can answer one attempt-scoped operation itself with a given
// status (and the wire error code that goes with it), and that counts the
// requests it sees per job and operation, with their times.
type faultProxy struct {
	srv *httptest.Server

	mu     sync.Mutex
	op     string // e.g. wire.OpRenew
	status int
	hangOp string        // an operation answered never (until the caller gives up)
	closed chan struct{} // ends hanging requests when the test is over
	seen   []proxied
}

type proxied struct {
	at      time.Time
	job, op string
	refused bool
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	tr := &http.Transport{}
	rp.Transport = tr
	f := &faultProxy{closed: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == wire.PathWorkerBatch {
			f.serveBatch(w, r, target, tr)
			return
		}
		job, op := attemptCall(r.URL.Path)
		f.mu.Lock()
		refuse := op != "" && op == f.op
		hang := op != "" && op == f.hangOp
		status := f.status
		f.seen = append(f.seen, proxied{at: time.Now(), job: job, op: op, refused: refuse})
		f.mu.Unlock()
		if hang {
			select {
			case <-r.Context().Done():
			case <-f.closed:
			}
			return
		}
		if refuse {
			_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, wire.MaxBodyBytes))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(wire.ErrorBody{Code: codeOf(status), Message: "refused by the test's proxy"})
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		close(f.closed)
		f.srv.Close()
		tr.CloseIdleConnections()
	})
	return f
}

// serveBatch treats each item of a daemon's worker batch as the per-call
// request it stands for: seen as its job's op, refused on its own, a hung
// op holding the whole batch; the rest go on, as one batch, to target.
func (f *faultProxy) serveBatch(w http.ResponseWriter, r *http.Request, target string, tr http.RoundTripper) {
	var req wire.WorkerBatch
	if err := json.NewDecoder(io.LimitReader(r.Body, wire.MaxBatchBodyBytes)).Decode(&req); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	results := make([]wire.BatchResult, len(req.Items))
	var pass wire.WorkerBatch
	var passed []int
	hang := false
	f.mu.Lock()
	for i, it := range req.Items {
		refuse := it.Op == f.op
		hang = hang || it.Op == f.hangOp
		f.seen = append(f.seen, proxied{at: time.Now(), job: it.JobID, op: it.Op, refused: refuse})
		if refuse {
			body, _ := json.Marshal(wire.ErrorBody{Code: codeOf(f.status), Message: "refused by the test's proxy"})
			results[i] = wire.BatchResult{Status: f.status, Body: body}
			continue
		}
		pass.Items = append(pass.Items, it)
		passed = append(passed, i)
	}
	f.mu.Unlock()
	if hang {
		select {
		case <-r.Context().Done():
		case <-f.closed:
		}
		return
	}
	if len(pass.Items) > 0 {
		b, _ := json.Marshal(pass)
		fwd, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, strings.TrimRight(target, "/")+wire.PathWorkerBatch, strings.NewReader(string(b)))
		fwd.Header.Set("Authorization", r.Header.Get("Authorization"))
		fwd.Header.Set("Content-Type", "application/json")
		resp, err := tr.RoundTrip(fwd)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		var out wire.WorkerBatchResponse
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Results) != len(passed) {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		for j, i := range passed {
			results[i] = out.Results[j]
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(wire.WorkerBatchResponse{Results: results})
}

// hang makes the proxy answer no call of op from now on: each waits until
// its caller gives up.
func (f *faultProxy) hang(op string) {
	f.mu.Lock()
	f.hangOp = op
	f.mu.Unlock()
}

// URL is the base address the daemon is given.
func (f *faultProxy) URL() string { return f.srv.URL }

// refuse makes the proxy answer every call of op with status from now on.
func (f *faultProxy) refuse(op string, status int) {
	f.mu.Lock()
	f.op, f.status = op, status
	f.mu.Unlock()
}

// calls returns the requests seen of job's op (any job if job is empty).
func (f *faultProxy) calls(job, op string) []proxied {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []proxied
	for _, p := range f.seen {
		if (job == "" || p.job == job) && p.op == op {
			out = append(out, p)
		}
	}
	return out
}

// attemptCall splits /v1/agent/worker/jobs/{job}/{op}.
func attemptCall(path string) (job, op string) {
	rest, ok := strings.CutPrefix(path, "/v1/agent/worker/jobs/")
	if !ok {
		return "", ""
	}
	job, op, _ = strings.Cut(rest, "/")
	return job, op
}

func codeOf(status int) string {
	switch status {
	case http.StatusConflict:
		return wire.CodeLeaseLost
	case http.StatusUnauthorized:
		return wire.CodeUnauthorized
	case http.StatusForbidden:
		return wire.CodeForbidden
	case http.StatusNotFound:
		return wire.CodeNotFound
	}
	return wire.CodeInternal
}
