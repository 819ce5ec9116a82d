package runner

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// loseFirstClaimAnswer lets the real control plane commit the first claim
// that finds a turn, then resets the connection before the answer goes
// out; it keeps the idempotency key of every claim request.
type loseFirstClaimAnswer struct {
	next http.Handler
	mu   sync.Mutex
	lost string   // the attempt of the lost answer
	keys []string // of every claim request, in order
}

func (l *loseFirstClaimAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != wire.PathClaim {
		l.next.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req wire.ClaimRequest
	_ = json.Unmarshal(body, &req)
	l.mu.Lock()
	l.keys = append(l.keys, req.IdempotencyKey)
	drop := l.lost == ""
	l.mu.Unlock()
	if !drop {
		l.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	l.next.ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		w.WriteHeader(rec.Code)
		io.Copy(w, rec.Body)
		return
	}
	var c wire.Claim
	_ = json.Unmarshal(rec.Body.Bytes(), &c)
	l.mu.Lock()
	l.lost = c.AttemptID
	l.mu.Unlock()
	if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
		conn.Close()
	}
}

// Issue 11 §11 through the real daemon: the answer of its claim is lost
// after the control plane committed it. The claim loop asks again with the
// same idempotency key, gets the same attempt back and runs it: the job
// ends with that one attempt, none orphaned for the reaper to count as a
// lost worker. The next claim has a new key.
func TestClaimAnswerLostIsResumed(t *testing.T) {
	c := newCP(t)
	l := &loseFirstClaimAnswer{next: c.srv.Handler()}
	hs := httptest.NewServer(l)
	t.Cleanup(hs.Close)
	j := c.enqueue("result")
	r := startDaemon(t, c, func(cfg *Config) { cfg.ControlPlaneURL = hs.URL })
	waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
	got := c.job(j.ID)
	if len(got.Attempts) != 1 || got.Attempts[0].Outcome != wire.OutcomeFailed || got.WorkerLostCount != 0 {
		t.Fatalf("job %s, attempts %+v, worker lost %d: want its one attempt run to its end", got.State, got.Attempts, got.WorkerLostCount)
	}
	l.mu.Lock()
	lost, keys := l.lost, append([]string(nil), l.keys...)
	l.mu.Unlock()
	if got.Attempts[0].ID != lost || len(keys) < 2 || keys[0] == "" || keys[1] != keys[0] {
		t.Fatalf("attempt %s, lost answer's %s, claim keys %v: want the retry with the first key", got.Attempts[0].ID, lost, keys)
	}
	waitFor(t, "the next claim", 5*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.keys) > 2
	})
	l.mu.Lock()
	next := l.keys[2]
	l.mu.Unlock()
	if next == keys[0] || next == "" {
		t.Fatalf("the claim after the resumed one reused the key %q", next)
	}
	if strings.Contains(r.logs.String(), keys[0]) {
		t.Error("a record holds the idempotency key")
	}
}
