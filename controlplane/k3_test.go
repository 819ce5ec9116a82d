package controlplane_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/controlplane/store/sqlstore"
	"github.com/runnerd/runnerd/wire"
)

// renewAll sends one renewal of every claim at once, as the queued
// renewals of a paused control plane arrive when it runs again, and
// returns the errors; with sweep, the reaper's own tick runs among them.
func renewAll(f *fixture, claims []wire.Claim, sweep bool) []error {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, len(claims))
	for i, c := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = f.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)})
		}()
	}
	if sweep {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.srv.Sweep(ctx)
		}()
	}
	wg.Wait()
	return errs
}

// K3, P4: the control plane paused (SIGSTOP) and then restarted, each time
// for longer than a lease, with renewals queued against it: every renewal
// is accepted — those answered before the reaper's first sweep too — and
// no turn is superseded or its conversation lost.
func TestK3RenewalsAcrossPauseAndRestartAccepted(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		ctx := context.Background()
		f.srv.Sweep(ctx) // the control plane is there, and its record says so
		claims := make([]wire.Claim, 12)
		for i := range claims {
			claims[i] = f.turn()
		}
		// Paused for three leases: nothing served, nothing swept. On
		// SIGCONT the queued renewals and the reaper's tick run together.
		f.clock.Advance(3 * controlplane.DefaultLeaseTTL)
		for i, err := range renewAll(f, claims, true) {
			if err != nil {
				t.Fatalf("renewal %d after the pause: %v", i, err)
			}
		}
		// Restarted after three more leases: a new process on the same
		// database; the renewals arrive before any sweep.
		f.clock.Advance(3 * controlplane.DefaultLeaseTTL)
		f.restart()
		for i, err := range renewAll(f, claims, false) {
			if err != nil {
				t.Fatalf("renewal %d after the restart, before any sweep: %v", i, err)
			}
		}
		f.srv.Sweep(ctx)
		for _, c := range claims {
			j := f.job(c.JobID)
			if j.State != wire.JobRunning || len(j.Attempts) != 1 || j.Attempts[0].State != wire.AttemptRunning {
				t.Fatalf("job after the absences = %+v", j)
			}
			if hasEvent(j, "lease.stale_report") || hasEvent(j, "attempt_superseded") {
				t.Fatalf("job blamed for the control plane's absence: %+v", j.Events)
			}
		}
	})
}

// K3, P4: `controlplane serve` resumes leases before it accepts a request
// (Server.Resume), so a restarted control plane whose first request is a
// sweep's victim's renewal still finds the lease running.
func TestK3ResumeBeforeServing(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		f := newFixtureOn(t, db)
		ctx := context.Background()
		f.srv.Sweep(ctx)
		c := f.turn()
		f.clock.Advance(3 * controlplane.DefaultLeaseTTL)
		f.restart()
		if err := f.srv.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		back := f.clock.Now()
		// The reaper's first sweep, right after, supersedes nothing: the
		// lease runs a full TTL from the return.
		f.clock.Advance(time.Second)
		f.srv.Sweep(ctx)
		j := f.job(c.JobID)
		if a := j.Attempts[0]; a.State != wire.AttemptRunning || !a.LeaseExpiresAt.Equal(back.Add(controlplane.DefaultLeaseTTL)) {
			t.Fatalf("attempt after the restart = %+v, want running to a full TTL from the return", a)
		}
		if !hasEvent(j, "lease_extended_after_absence") {
			t.Fatalf("no lease_extended_after_absence event: %+v", j.Events)
		}
		if _, err := f.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err != nil {
			t.Fatalf("renewal after the restart: %v", err)
		}
	})
}

// shift is a clock offset a test moves; it guards its value.
type shift struct {
	mu sync.Mutex
	d  time.Duration // guarded by mu
}

func (s *shift) add(d time.Duration) {
	s.mu.Lock()
	s.d += d
	s.mu.Unlock()
}

func (s *shift) of(base time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return base.Add(s.d)
}

// K3: two replicas on one database whose own clocks are ten minutes ahead
// and ten minutes behind. Leases, reaping and absence are judged on the
// database's clock (on SQLite the one process's), moved here by a shared
// offset instead of waiting: a dead worker's attempt is superseded within
// lease + grace of its last renewal, and no sweep of either replica takes
// the other's record for an absence and extends a lease. A host is judged
// online on the same clock, and the skew is shown on each replica's admin
// page.
func TestK3ReplicasWithSkewedClocks(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		ctx := context.Background()
		moved := &shift{}
		const (
			interval = time.Second
			grace    = 5 * time.Second
			ttl      = controlplane.DefaultMinLeaseTTL
		)
		type replica struct {
			srv *controlplane.Server
			wc  *wire.Client
			url string
		}
		var reps []replica
		var hostToken string
		for i, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
			st := db.open(t, sqlstore.WithClock(moved.of))
			srv := controlplane.New(controlplane.Config{
				Store: st, Logger: slog.New(slog.DiscardHandler),
				Now:            func() time.Time { return time.Now().Add(skew) },
				ReaperInterval: interval, ReaperGrace: grace,
			})
			hs := httptest.NewServer(srv.Handler())
			t.Cleanup(hs.Close)
			reps = append(reps, replica{srv, &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}, hs.URL})
			if i == 0 {
				hostToken = controlplane.NewToken(controlplane.HostTokenPrefix)
				now, err := st.Now(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.CreateHost(ctx, "host-a", controlplane.HashToken(hostToken), store.Audit{Actor: "test"}, now); err != nil {
					t.Fatal(err)
				}
				if _, err := st.CreateUserToken(ctx, "test", controlplane.HashToken(userToken), store.Audit{Actor: "test"}, now); err != nil {
					t.Fatal(err)
				}
			}
		}
		a, b := reps[0], reps[1]
		var conv wire.Conversation
		if _, err := a.wc.Do(ctx, "POST", "/v1/conversations", userToken,
			wire.CreateConversationRequest{Image: "demo", AgentCommand: []string{"demo-agent"}}, &conv); err != nil {
			t.Fatal(err)
		}
		var job wire.Job
		if _, err := b.wc.Do(ctx, "POST", "/v1/conversations/"+conv.ID+"/messages", userToken,
			wire.SendMessageRequest{Prompt: "hello"}, &job); err != nil {
			t.Fatal(err)
		}
		c, err := a.wc.Claim(ctx, hostToken, wire.ClaimRequest{LeaseTTLMS: ttl.Milliseconds()})
		if err != nil {
			t.Fatal(err)
		}
		// Both replicas sweep every interval, interleaved.
		sweep := func() {
			for _, r := range []replica{a, b} {
				r.srv.Sweep(ctx)
			}
			moved.add(interval / 2)
		}
		for step := time.Duration(0); step < ttl/2; step += interval / 2 {
			sweep()
		}
		// Renewed through the slow replica.
		rn, err := b.wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c), LeaseTTLMS: ttl.Milliseconds()})
		if err != nil {
			t.Fatalf("renewal through the other replica: %v", err)
		}
		// The worker dies now.
		var ended *time.Time
		for step := time.Duration(0); ended == nil && step <= ttl+grace+10*interval; step += interval / 2 {
			for _, r := range []replica{a, b} {
				r.srv.Sweep(ctx)
				var j wire.Job
				if _, err := r.wc.Do(ctx, "GET", "/v1/jobs/"+c.JobID, userToken, nil, &j); err != nil {
					t.Fatal(err)
				}
				if hasEvent(j, "lease_extended_after_absence") {
					t.Fatalf("a replica's sweep extended the lease at %v after the renewal: %+v", step, j.Events)
				}
				if ended == nil && j.Attempts[0].State == wire.AttemptSuperseded {
					ended = j.Attempts[0].EndedAt
				}
			}
			moved.add(interval / 2)
		}
		// On the store's clock: past expiry + grace (P3), and within one
		// sweep interval of it.
		switch {
		case ended == nil:
			t.Fatalf("the dead worker's attempt (lease to %v) was never superseded", rn.LeaseExpiresAt)
		case ended.Sub(rn.LeaseExpiresAt) <= grace || ended.Sub(rn.LeaseExpiresAt) > grace+2*interval:
			t.Fatalf("superseded %v after the lease's expiry, want just past the grace (%v)", ended.Sub(rn.LeaseExpiresAt), grace)
		}
		// A host that beat through the slow replica is online on the fast
		// one: its state is judged on the store's clock too.
		if _, err := b.wc.HostHeartbeat(ctx, hostToken, wire.HostHeartbeat{Capacity: 1}); err != nil {
			t.Fatal(err)
		}
		var list wire.ServerList
		if _, err := a.wc.Do(ctx, "GET", "/v1/admin/servers", userToken, nil, &list); err != nil {
			t.Fatal(err)
		}
		if len(list.Servers) != 1 || list.Servers[0].State != wire.HostOnline {
			t.Fatalf("servers on the fast replica = %+v, want host-a online", list.Servers)
		}
		req, _ := http.NewRequest(http.MethodGet, a.url+"/admin/servers", nil)
		req.Header.Set("Authorization", "Bearer "+userToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "s off the store's, on which leases are judged") {
			t.Fatalf("admin page of the fast replica (HTTP %d) does not show its skew:\n%s", resp.StatusCode, page)
		}
	})
}

// K3: a claim's lease is counted on the store's clock, never on the
// replica's that serves it. Two replicas ten minutes ahead and behind on
// one database whose clock stands still: each one's claim answers
// lease_expires_at exactly the store's clock plus the lease granted, and
// the attempt the job shows has the same expiry — read before any renewal
// could overwrite it.
func TestK3ClaimLeaseOnTheStoresClock(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		ctx := context.Background()
		storeNow := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
		const ttl = controlplane.DefaultMinLeaseTTL
		var hostToken string
		for i, skew := range []time.Duration{10 * time.Minute, -10 * time.Minute} {
			st := db.open(t, sqlstore.WithClock(func(time.Time) time.Time { return storeNow }))
			srv := controlplane.New(controlplane.Config{
				Store: st, Logger: slog.New(slog.DiscardHandler),
				Now: func() time.Time { return time.Now().Add(skew) },
			})
			hs := httptest.NewServer(srv.Handler())
			t.Cleanup(hs.Close)
			wc := &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
			if i == 0 {
				hostToken = controlplane.NewToken(controlplane.HostTokenPrefix)
				if _, err := st.CreateHost(ctx, "host-a", controlplane.HashToken(hostToken), store.Audit{Actor: "test"}, storeNow); err != nil {
					t.Fatal(err)
				}
			}
			conv, err := st.CreateConversation(ctx, wire.CreateConversationRequest{Image: "demo", AgentCommand: []string{"demo-agent"}}, storeNow)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.EnqueueTurn(ctx, conv.ID, "hello", storeNow); err != nil {
				t.Fatal(err)
			}
			c, err := wc.Claim(ctx, hostToken, wire.ClaimRequest{LeaseTTLMS: ttl.Milliseconds()})
			if err != nil {
				t.Fatal(err)
			}
			want := storeNow.Add(ttl)
			if !c.LeaseExpiresAt.Equal(want) || c.LeaseTTLMS != ttl.Milliseconds() {
				t.Fatalf("claim through the replica %v off: lease_expires_at %v (ttl %d ms), want the store's clock + %v = %v",
					skew, c.LeaseExpiresAt, c.LeaseTTLMS, ttl, want)
			}
			j, err := st.GetJob(ctx, c.JobID)
			if err != nil {
				t.Fatal(err)
			}
			if len(j.Attempts) != 1 || !j.Attempts[0].LeaseExpiresAt.Equal(want) {
				t.Fatalf("the claimed attempt through the replica %v off = %+v, want its lease to %v", skew, j.Attempts, want)
			}
		}
	})
}
