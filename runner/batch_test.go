package runner

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/wire"
)

// claimRecorder passes every call to the real control plane and keeps,
// for each claim request, the max_claims it asked for and how many turns
// its answer gave. older makes it answer a claim that names max_claims as
// a control plane from before batched claims does: 400 unknown_field.
type claimRecorder struct {
	next  http.Handler
	older bool

	mu    sync.Mutex // guards asked and given
	asked []int
	given []int
}

func (c *claimRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != wire.PathClaim {
		c.next.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req wire.ClaimRequest
	_ = json.Unmarshal(body, &req)
	if c.older && bytes.Contains(body, []byte(`"max_claims"`)) {
		c.record(req.MaxClaims, 0)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(wire.ErrorBody{Code: wire.CodeUnknownField})
		return
	}
	rec := httptest.NewRecorder()
	c.next.ServeHTTP(rec, r)
	n := 0
	if rec.Code == http.StatusOK {
		n = 1
		if req.MaxClaims > 1 {
			var b wire.ClaimBatch
			_ = json.Unmarshal(rec.Body.Bytes(), &b)
			n = len(b.Claims)
		}
	}
	c.record(req.MaxClaims, n)
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

func (c *claimRecorder) record(asked, given int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked = append(c.asked, asked)
	c.given = append(c.given, given)
}

func (c *claimRecorder) claims() (asked, given []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.asked...), append([]int(nil), c.given...)
}

// A daemon with 4 free slots asks for 4 turns in one claim
// and launches each: the 4 queued turns of 4 conversations come in the
// first claim's one answer, each runs as its own attempt to its end.
func TestDaemonClaimsAsManyTurnsAsFreeSlots(t *testing.T) {
	c := newCP(t)
	var jobs []wire.Job
	for range 4 {
		jobs = append(jobs, c.enqueue("result"))
	}
	rec := &claimRecorder{next: c.srv.Handler()}
	hs := httptest.NewServer(rec)
	t.Cleanup(hs.Close)
	startDaemon(t, c, func(cfg *Config) {
		cfg.ControlPlaneURL = hs.URL
		cfg.Capacity = 4
	})
	for _, j := range jobs {
		waitFor(t, "every turn to end", time.Minute, ended(c, j.ID))
	}
	asked, given := rec.claims()
	if len(asked) == 0 || asked[0] != 4 || given[0] != 4 {
		t.Fatalf("claims asked for %v and were given %v; want the first to ask for 4 and get the 4 turns", asked, given)
	}
	for _, j := range jobs {
		if got := c.job(j.ID); len(got.Attempts) != 1 || got.Attempts[0].Outcome != wire.OutcomeFailed {
			t.Fatalf("job %s: %+v; want its one attempt run to the child's result", j.ID, got.Attempts)
		}
	}
}

// A control plane from before batched claims refuses max_claims (400
// unknown_field): the daemon says so once and claims one turn per request
// from then on, and every turn still runs.
func TestDaemonClaimsOneAtATimeFromAnOlderControlPlane(t *testing.T) {
	c := newCP(t)
	j1, j2 := c.enqueue("result"), c.enqueue("result")
	rec := &claimRecorder{next: c.srv.Handler(), older: true}
	hs := httptest.NewServer(rec)
	t.Cleanup(hs.Close)
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.ControlPlaneURL = hs.URL
		cfg.Capacity = 2
	})
	waitFor(t, "both turns to end", time.Minute, func() bool { return ended(c, j1.ID)() && ended(c, j2.ID)() })
	asked, given := rec.claims()
	if len(asked) < 3 || asked[0] != 2 || given[0] != 0 || asked[1] > 1 || given[1] != 1 || asked[2] > 1 {
		t.Fatalf("claims asked for %v and were given %v; want one refused batch, then single claims", asked, given)
	}
	if n := r.logs.count(MsgClaimBatchRefused); n != 1 {
		t.Fatalf("%d %s records, want 1", n, MsgClaimBatchRefused)
	}
}
