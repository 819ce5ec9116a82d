package runner

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
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
	"github.com/runnerd/runnerd/wire"
)

// hostEndpoint is a simulated control plane for the host-scoped calls: a
// real http.Handler on a memnet listener inside a synctest bubble.
type hostEndpoint struct {
	t0     time.Time
	claim  func(n int) int // status of the n-th claim (from 1); 204 = none
	mu     sync.Mutex
	claims []time.Duration
	beats  []wire.HostHeartbeat
	beatAt []time.Duration
	// hangBeats makes every host heartbeat hang until the client gives up;
	// gaveUp has when each hung request's context ended.
	hangBeats bool
	gaveUp    []time.Duration
}

func (e *hostEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Since(e.t0)
	switch r.URL.Path {
	case wire.PathClaim:
		var req wire.ClaimRequest
		if json.NewDecoder(io.LimitReader(r.Body, wire.MaxBodyBytes)).Decode(&req) != nil || r.Header.Get("Authorization") != "Bearer rdh_host" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.claims = append(e.claims, at)
		n := len(e.claims)
		e.mu.Unlock()
		status := e.claim(n)
		if status == http.StatusNoContent {
			select { // the long poll
			case <-time.After(time.Duration(req.WaitMS) * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(status)
	case wire.PathHostHeartbeat:
		var hb wire.HostHeartbeat
		if json.NewDecoder(io.LimitReader(r.Body, wire.MaxBodyBytes)).Decode(&hb) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.beats = append(e.beats, hb)
		e.beatAt = append(e.beatAt, at)
		e.mu.Unlock()
		if e.hangBeats {
			<-r.Context().Done()
			e.mu.Lock()
			e.gaveUp = append(e.gaveUp, time.Since(e.t0))
			e.mu.Unlock()
			return
		}
		json.NewEncoder(w).Encode(wire.HostHeartbeatResponse{ServerTime: time.Now()})
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func (e *hostEndpoint) claimTimes() []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]time.Duration(nil), e.claims...)
}

// runInBubble runs a daemon against e for d of fake time, then drains it.
func runInBubble(t *testing.T, e *hostEndpoint, stateDir string, d time.Duration) *logBuf {
	l := memnet.Listen("cp.test")
	srv := &http.Server{Handler: e}
	go srv.Serve(l)
	logs := &logBuf{}
	dm, err := New(Config{
		ControlPlaneURL: "http://cp.test",
		HostToken:       "rdh_host",
		HostName:        "host-a",
		StateDir:        stateDir,
		Executable:      "/bin/false",
		ClaimWait:       10 * time.Second,
		ClaimBackoff:    time.Second,
		ClaimBackoffMax: 16 * time.Second,
		Transport:       &http.Transport{DialContext: l.Dial},
		Logger:          slog.New(slog.NewJSONHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); dm.Run(ctx) }()
	time.Sleep(d)
	dm.Drain()
	<-done
	srv.Close()
	synctest.Wait() // the handlers see their connections close
	return logs
}

// Failed claims back off exponentially with jitter (1, 2, 4, 8, 16, 16 s,
// each ±20 %), with one agent_control_failure for the outage; an answer
// resets the backoff; empty long polls are re-polled after a short random
// pause. Host heartbeats go every 10 s ±20 %.
func TestClaimBackoffWithJitter(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		e := &hostEndpoint{t0: time.Now(), claim: func(n int) int {
			if n <= 7 {
				return http.StatusServiceUnavailable
			}
			return http.StatusNoContent
		}}
		logs := runInBubble(t, e, dir, 100*time.Second)
		got := e.claimTimes()
		if len(got) < 9 {
			t.Fatalf("%d claims: %v", len(got), got)
		}
		for i, base := range []float64{1, 2, 4, 8, 16, 16} {
			gap := got[i+1] - got[i]
			lo, hi := time.Duration(base*0.8*float64(time.Second)), time.Duration(base*1.2*float64(time.Second))
			if gap < lo || gap > hi {
				t.Fatalf("gap %d = %v, want %v..%v (claims at %v)", i, gap, lo, hi, got)
			}
		}
		// After the 8th claim answered 204 (a 10 s long poll), the next
		// follows within half the claim backoff.
		if gap := got[8] - got[7]; gap < 10*time.Second || gap >= 10*time.Second+500*time.Millisecond {
			t.Fatalf("re-poll after an empty long poll: %v", gap)
		}
		if n := logs.count("agent_control_failure"); n != 1 {
			t.Fatalf("%d control failure records for one outage", n)
		}
		if n := logs.count(MsgControlRecovered); n != 1 {
			t.Fatalf("%d recovered records", n)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for i := 1; i < len(e.beatAt); i++ {
			gap := e.beatAt[i] - e.beatAt[i-1]
			if gap != 0 && (gap < 8*time.Second || gap > 12*time.Second) && !e.beats[i].Draining {
				t.Fatalf("host heartbeat gap %v", gap)
			}
		}
		if len(e.beats) < 9 || e.beats[0].Capacity != DefaultCapacity || !e.beats[len(e.beats)-1].Draining {
			t.Fatalf("%d host heartbeats, first %+v, last %+v", len(e.beats), e.beats[0], e.beats[len(e.beats)-1])
		}
	})
}

// A refused host token stops claiming for good, with one record (and
// ends Run with ErrHostTokenRefused: TestHostTokenRefusedEndsRunFailed).
func TestHostTokenRefusedOnClaimStopsClaiming(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		e := &hostEndpoint{t0: time.Now(), claim: func(int) int { return http.StatusUnauthorized }}
		logs := runInBubble(t, e, dir, 10*time.Minute)
		if got := e.claimTimes(); len(got) != 1 {
			t.Fatalf("%d claims after a refusal", len(got))
		}
		if n := logs.count(MsgHostTokenRefused); n != 1 {
			t.Fatalf("%d refusal records", n)
		}
	})
}

// A 404 on a claim is no verdict on the host token (the control plane
// answers a token it refuses 401 or 403): the address serves no such
// endpoint, a wrong path in --control-plane. It is recorded once as that
// and the claim is retried; claiming never stops for it.
func TestClaimNotFoundIsNoTokenVerdict(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		e := &hostEndpoint{t0: time.Now(), claim: func(int) int { return http.StatusNotFound }}
		logs := runInBubble(t, e, dir, 10*time.Minute)
		if got := e.claimTimes(); len(got) < 10 {
			t.Fatalf("%d claims in ten minutes of 404s, want them retried", len(got))
		}
		if n := logs.count(MsgHostTokenRefused); n != 0 {
			t.Fatalf("%d host token refusals for a 404", n)
		}
		if n := logs.count(MsgEndpointMissing); n != 1 {
			t.Fatalf("%d %s records for one outage, want 1", n, MsgEndpointMissing)
		}
	})
}

// R6: a control request other than a renewal or a receipt — here the host
// heartbeat — is bounded by the 30 s control timeout: a hung endpoint is
// given up exactly 30 s after the request was sent, once per outage is
// recorded, and the next heartbeat follows one interval (±20 %) later.
func TestR6HungHostHeartbeatGivesUpAfterControlTimeout(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		e := &hostEndpoint{t0: time.Now(), hangBeats: true, claim: func(int) int { return http.StatusNoContent }}
		logs := runInBubble(t, e, dir, 95*time.Second)
		e.mu.Lock()
		defer e.mu.Unlock()
		if len(e.beatAt) < 3 || len(e.gaveUp) < 2 {
			t.Fatalf("heartbeats sent at %v, given up at %v", e.beatAt, e.gaveUp)
		}
		for i := 0; i < 2; i++ {
			if held := e.gaveUp[i] - e.beatAt[i]; held != DefaultControlTimeout {
				t.Fatalf("heartbeat %d held %v, want the control timeout %v", i, held, DefaultControlTimeout)
			}
			if gap := e.beatAt[i+1] - e.gaveUp[i]; gap < 8*time.Second || gap > 12*time.Second {
				t.Fatalf("next heartbeat %v after giving up, want 10 s ±20 %%", gap)
			}
		}
		if n := logs.count("agent_control_failure"); n != 1 {
			t.Fatalf("%d control failure records for one outage, want 1", n)
		}
	})
}

// bubbleCP is the real reference control plane on a real SQLite store,
// served over memnet so that it runs inside a synctest bubble (open and
// close it inside the bubble).
type bubbleCP struct {
	st        store.Store
	wc        *wire.Client
	dial      func(ctx context.Context, network, addr string) (net.Conn, error)
	hostToken string
}

// newBubbleCP serves the control plane, through wrap when one is given.
func newBubbleCP(t *testing.T, dir string, wrap ...func(http.Handler) http.Handler) *bubbleCP {
	t.Helper()
	st, err := sqlstore.OpenSQLite(context.Background(), filepath.Join(dir, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler), MinLeaseTTL: time.Second})
	l := memnet.Listen("cp.test")
	h := srv.Handler()
	for _, w := range wrap {
		h = w(h)
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(l)
	t.Cleanup(func() {
		// Close alone does not wait for the handlers in flight (a renewal
		// answered as the test ends), which would race with the store's
		// close; Shutdown does.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		hs.Shutdown(ctx)
		hs.Close()
		st.Close()
	})
	c := &bubbleCP{
		st:        st,
		wc:        &wire.Client{BaseURL: "http://cp.test", HTTP: &http.Client{Transport: &http.Transport{DialContext: l.Dial}}},
		dial:      l.Dial,
		hostToken: controlplane.NewToken(controlplane.HostTokenPrefix),
	}
	if _, err := st.CreateHost(context.Background(), "host-a", controlplane.HashToken(c.hostToken), store.Audit{Actor: "test"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *bubbleCP) enqueue(t *testing.T) wire.Job {
	t.Helper()
	ctx := context.Background()
	conv, err := c.st.CreateConversation(ctx, wire.CreateConversationRequest{Image: "scratch", AgentCommand: []string{"demoagent"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.st.EnqueueTurn(ctx, conv.ID, "hello", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// K4: a claim the control plane held 20 s of a 30 s long poll, with a 6 s
// lease. Counted from the send alone the lease would be over 14 s before
// the answer came (the first round's failure); counted from send + held
// the real renewer's deadline is send + held + ttl, never later than the
// server's expiry, and the turn keeps its lease through the real control
// plane's renewals.
func TestK4ClaimLeaseCountsFromSendPlusHeld(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		c := newBubbleCP(t, dir)
		const ttl, heldFor = 6 * time.Second, 20 * time.Second
		go func() {
			time.Sleep(heldFor)
			c.enqueue(t)
		}()
		sent := time.Now()
		claim, err := c.wc.Claim(context.Background(), c.hostToken, wire.ClaimRequest{WaitMS: 30_000, LeaseTTLMS: ttl.Milliseconds()})
		answered := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		held := claim.Held()
		if held < heldFor || held > answered.Sub(sent) {
			t.Fatalf("held_ms %v; the job came after %v and the answer after %v", held, heldFor, answered.Sub(sent))
		}
		if !answered.After(sent.Add(ttl)) {
			t.Fatalf("the answer came %v after the send: no longer than the lease, the test shows nothing", answered.Sub(sent))
		}
		timings := heartbeat.Timings{LeaseTTL: ttl, Interval: 2 * time.Second, RequestTimeout: time.Second, RetryDelay: time.Second}
		clock := boottime.Since(sent) // the bubble's fake time
		r := heartbeat.Start(heartbeat.Config{Timings: timings, Client: c.wc, Clock: clock},
			heartbeat.AttemptFromClaim(claim, leaseStart(sent, held, answered)))
		at := func(t time.Time) boottime.Instant { return boottime.FromTime(clock, t) }
		if got, want := r.Lease().Deadline, at(sent.Add(held).Add(ttl)); got != want {
			t.Fatalf("deadline %v after the send, want send + held + ttl = %v", got.Sub(at(sent)), want.Sub(at(sent)))
		}
		if r.Lease().Deadline > at(claim.LeaseExpiresAt) {
			t.Fatalf("local deadline %v is later than the server's expiry %v", r.Lease().Deadline, at(claim.LeaseExpiresAt))
		}
		time.Sleep(time.Minute)
		select {
		case <-r.Done():
			t.Fatalf("the renewer ended within a minute: %+v", r.Verdict())
		default:
		}
		r.Stop()
		if v := r.Verdict(); v.Outcome != heartbeat.Stopped || v.Renewals < 25 {
			t.Fatalf("verdict %+v, want stopped after about 30 renewals", v)
		}
	})
}

// The hold counts at most the time that passed between send and answer
// here: a control plane whose clock runs fast cannot move the lease's
// start past the answer.
func TestK4LeaseStartCapsTheHold(t *testing.T) {
	sent := time.Now()
	for _, tc := range []struct {
		name           string
		held, answered time.Duration
		want           time.Duration
	}{
		{name: "immediate", held: 0, answered: 3 * time.Millisecond, want: 0},
		{name: "held", held: 20 * time.Second, answered: 20*time.Second + 5*time.Millisecond, want: 20 * time.Second},
		{name: "held longer than seen", held: 25 * time.Second, answered: 20 * time.Second, want: 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := leaseStart(sent, tc.held, sent.Add(tc.answered)).Sub(sent); got != tc.want {
				t.Fatalf("lease start %v after the send, want %v", got, tc.want)
			}
		})
	}
}
