package runner

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runnerd/runnerd/runner/turn"
	"github.com/runnerd/runnerd/wire"
)

// scrape fetches the registry through the real Prometheus handler and
// returns series → value (the series as the text format writes it).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d %v", resp.StatusCode, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

func metricsServer(t *testing.T) (*Metrics, string) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(hs.Close)
	return m, hs.URL
}

// The daemon's series, scraped through the real handler while a turn runs
// and after it ended: slots, leases and the smallest lease margin follow
// the held turn; a user cancel ends it with a turn duration; the drain
// shows. runnerd_claim_to_accept_seconds starts at the claim's answer: the
// long poll was held open for 600 ms before the turn was even queued, and
// the measured time is the launch's alone.
func TestDaemonMetricsMoveWithATurn(t *testing.T) {
	c := newCP(t)
	m, url := metricsServer(t)
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.Metrics = m
		cfg.ClaimWait = time.Second // the control plane's ClaimWaitMax
	})
	waitFor(t, "a claim in flight", 5*time.Second, func() bool {
		s := r.d.status(time.Now())
		return s.busy == 1 && s.running == 0
	})
	got := scrape(t, url)
	if got["runnerd_slots"] != 1 || got["runnerd_slots_busy"] != 1 || got["runnerd_leases_held"] != 0 ||
		got[`runnerd_claims_paused{reason="launch_failures"}`] != 0 || got["runnerd_draining"] != 0 {
		t.Fatalf("idle daemon's series: %v", got)
	}
	if _, ok := got["runnerd_lease_margin_min_seconds"]; ok {
		t.Fatal("a lease margin with no lease held")
	}
	// Not waiting for anything: the long poll must be old when the claim
	// is granted, so that a measurement from its start would show.
	time.Sleep(600 * time.Millisecond)
	enqueued := time.Now()
	j := c.enqueue("stopped")
	waitFor(t, "the turn accepted", 10*time.Second, func() bool { return r.logs.has(MsgTurnAccepted) })
	// The claim's answer came after the turn was queued, so claim → accept
	// is at most the time from the enqueue until the acceptance was seen;
	// measured from the long poll's start it would be at least 600 ms more.
	// An order, not a speed: it holds however slow the machine is.
	sinceQueued := time.Since(enqueued)

	got = scrape(t, url)
	if got["runnerd_leases_held"] != 1 || got["runnerd_slots_busy"] < 1 {
		t.Fatalf("running turn's series: %v", got)
	}
	margin, ok := got["runnerd_lease_margin_min_seconds"]
	if !ok || margin <= 0 || margin > testTimings.LeaseTTL.Seconds() {
		t.Fatalf("runnerd_lease_margin_min_seconds = %v (held %v), want in (0, %v]", margin, ok, testTimings.LeaseTTL)
	}
	// The claim said how long the turn was queued: one sample, no longer
	// than the turn has existed.
	if n, sum := got["runnerd_queue_wait_seconds_count"], got["runnerd_queue_wait_seconds_sum"]; n != 1 || sum < 0 || sum > sinceQueued.Seconds() {
		t.Fatalf("queue wait: %v samples, %v s; want one of at most the %v since the enqueue", n, sum, sinceQueued)
	}
	if n, sum := got["runnerd_claim_to_accept_seconds_count"], got["runnerd_claim_to_accept_seconds_sum"]; n != 1 || sum > sinceQueued.Seconds() {
		t.Fatalf("claim to accept: %v samples, %v s, more than the %v from the enqueue to the acceptance: measured from the long poll's start, not the claim's answer", n, sum, sinceQueued)
	}

	// A renewal first: the cancel reaches the turn through the host's
	// cancel poll, often before the first renewal is due.
	waitFor(t, "a renewal acknowledged", 10*time.Second, func() bool {
		return scrape(t, url)[`runnerd_renewals_total{result="ok"}`] >= 1
	})
	if _, err := c.st.CancelJob(context.Background(), j.ID, c.now()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job to end", 15*time.Second, ended(c, j.ID))
	waitFor(t, "the lease let go", 5*time.Second, func() bool {
		got = scrape(t, url)
		return got["runnerd_leases_held"] == 0 && got[`runnerd_turns_total{outcome="cancelled"}`] == 1
	})
	if _, ok := got["runnerd_lease_margin_min_seconds"]; ok {
		t.Error("a lease margin after the lease was let go")
	}
	if n := got[`runnerd_turn_duration_seconds_count{outcome="cancelled"}`]; n != 1 {
		t.Errorf("turn duration samples = %v", n)
	}
	if got["runnerd_renewals_total{result=\"ok\"}"] < 1 || got["runnerd_renewal_latency_seconds_count"] < got["runnerd_renewals_total{result=\"ok\"}"] {
		t.Errorf("renewals %v, latency samples %v", got[`runnerd_renewals_total{result="ok"}`], got["runnerd_renewal_latency_seconds_count"])
	}
	if j := c.job(j.ID); j.State != wire.JobCancelled {
		t.Fatalf("job %s", j.State)
	}

	r.d.Drain()
	if got := scrape(t, url); got["runnerd_draining"] != 1 {
		t.Errorf("runnerd_draining = %v after Drain", got["runnerd_draining"])
	}
}

// A decline counts as a launch failure and as a decline of its own class;
// past the threshold claiming pauses, and the gauge says why.
func TestDaemonMetricsCountDeclines(t *testing.T) {
	c := newCP(t)
	m, url := metricsServer(t)
	r := startDaemon(t, c, func(cfg *Config) {
		cfg.Metrics = m
		cfg.LaunchFailures = 1
		cfg.LaunchBackoff, cfg.LaunchBackoffMax = time.Hour, time.Hour
	})
	c.enqueue("decline")
	waitFor(t, "the decline counted", 10*time.Second, func() bool {
		return scrape(t, url)[`runnerd_declines_total{class="preflight_failed"}`] == 1
	})
	got := scrape(t, url)
	if got[`runnerd_launch_failures_total{class="declined:preflight_failed"}`] != 1 ||
		got[`runnerd_claims_paused{reason="launch_failures"}`] != 1 || got[`runnerd_claims_paused{reason="host_token_refused"}`] != 0 {
		t.Fatalf("series after a decline: %v", got)
	}
	waitFor(t, "the release sent and the slot free", 10*time.Second, func() bool {
		return r.d.status(time.Now()).String() == "claims paused: launch failures (0/1 turns)"
	})
}

// A turn's RESULT says what image pull its sandbox needed: none is not
// counted, a pull made counts as pulled with its duration, a failed one
// as failed with none.
func TestMetricsCountImagePulls(t *testing.T) {
	m, url := metricsServer(t)
	for _, p := range []*turn.ImagePull{nil, {DurationMS: 1500}, {DurationMS: 20, Failed: true}, {DurationMS: 500}} {
		m.imagePull(p)
	}
	got := scrape(t, url)
	if got[`runnerd_image_pulls_total{result="pulled"}`] != 2 || got[`runnerd_image_pulls_total{result="failed"}`] != 1 ||
		got[`runnerd_image_pull_seconds_count`] != 2 || got[`runnerd_image_pull_seconds_sum`] != 2 {
		t.Fatalf("pull series: pulled %v, failed %v, timed %v summing %v s; want 2, 1, 2, 2",
			got[`runnerd_image_pulls_total{result="pulled"}`], got[`runnerd_image_pulls_total{result="failed"}`],
			got[`runnerd_image_pull_seconds_count`], got[`runnerd_image_pull_seconds_sum`])
	}
}
