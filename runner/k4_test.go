package runner

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/boottime"
	"github.com/runnerd/runnerd/wire"
)

// K4, through the daemon's own claim loop: the real control plane holds
// the claim 20 s of a 30 s long poll before it grants a 6 s lease, and
// from then on answers no renewal and no release (503), so the attempt's
// renewer keeps its lease exactly until its local deadline. That deadline
// — the agent_lease_expired record, on the bubble's clock — is the claim's
// send + held_ms + TTL: the server's own expiry, 6 s after the grant. A
// daemon that ignored held_ms would count from the send and give the lease
// up at the grant, 14 s after it was over locally.
func TestK4ClaimLoopLeaseCountsHeld(t *testing.T) {
	dir, stateDir := t.TempDir(), t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		const ttl, heldFor = 6 * time.Second, 20 * time.Second
		silent := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// A worker batch carries only these here (the launch fails:
				// no report but the release); 503 is each item's answer.
				if strings.HasSuffix(r.URL.Path, "/renew") || strings.HasSuffix(r.URL.Path, "/release") || r.URL.Path == wire.PathWorkerBatch {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				h.ServeHTTP(w, r)
			})
		}
		c := newBubbleCP(t, dir, silent)
		logs := &logBuf{}
		cfg := Config{
			ControlPlaneURL: "http://cp.test",
			HostToken:       c.hostToken,
			HostName:        "host-a",
			StateDir:        stateDir,
			Executable:      "/nonexistent/runnerd", // the launch fails: the release is what keeps the attempt
			Timings:         heartbeat.Timings{LeaseTTL: ttl, Interval: 2 * time.Second, RequestTimeout: time.Second, RetryDelay: time.Second},
			ClaimWait:       30 * time.Second,
			Transport:       &http.Transport{DialContext: c.dial},
			Logger:          slog.New(slog.NewJSONHandler(logs, nil)),
			Clock:           boottime.Since(time.Now()), // the bubble's fake time
		}
		cfg.RenewHTTP.DialContext = c.dial
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(heldFor)
			c.enqueue(t)
		}()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() { defer close(done); d.Run(ctx) }()
		time.Sleep(heldFor + 2*ttl)
		d.Drain()
		<-done

		list, err := c.st.ListJobs(context.Background(), store.JobFilter{})
		jobs := list.Jobs
		if err != nil || len(jobs) != 1 || len(jobs[0].Attempts) != 1 {
			t.Fatalf("jobs %+v, %v: want one claimed attempt", jobs, err)
		}
		a := jobs[0].Attempts[0]
		var expired []time.Time
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var r struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &r) == nil && r.Msg == diagnostics.MsgLeaseExpired {
				expired = append(expired, r.Time)
			}
		}
		if len(expired) != 1 {
			t.Fatalf("%d %s records, want one:\n%s", len(expired), diagnostics.MsgLeaseExpired, logs)
		}
		if got := expired[0].Sub(a.ClaimedAt); got < ttl-time.Millisecond || got > ttl+time.Millisecond {
			t.Fatalf("expired at %v, claimed at %v, server expiry %v: the lease ended locally %v after the grant, want the TTL %v (send + held + TTL): held_ms not counted", expired[0], a.ClaimedAt, a.LeaseExpiresAt, got, ttl)
		}
		if expired[0].After(a.LeaseExpiresAt) {
			t.Fatalf("the local deadline %v is later than the server's expiry %v", expired[0], a.LeaseExpiresAt)
		}
	})
}
