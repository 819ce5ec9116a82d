package integration

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/internal/fleet"
	"github.com/runnerd/runnerd/wire"
)

// TestWorkerBatchRequests runs the same turns through a daemon that
// batches its reports (the default) and through one with
// --batch-requests=false, each against its own real control plane: with
// batching the control plane answers worker batch requests, whose finish
// items are the turns' own, renewals are never among them (each goes at
// once, R14), and every turn succeeds; without it none comes. It logs the control plane's requests per turn
// in both.
func TestWorkerBatchRequests(t *testing.T) {
	t.Parallel()
	const turns = 4
	run := func(t *testing.T, batch bool) (metrics map[string]float64, perTurn float64) {
		e := newEnv(t, envOpts{leaseTTL: calmLease})
		e.startDaemon(func(c *fleet.DaemonConfig) {
			calm(c)
			c.Args = append(c.Args, "--batch-requests="+strconv.FormatBool(batch))
		})
		var jobs []wire.Job
		for i := range turns {
			// Silent past two renewal intervals: renewals go meanwhile.
			jobs = append(jobs, e.send(e.conversation(fmt.Sprintf("batch %d", i)).ID, "hello\n!events 3\n!silent 5s"))
		}
		for _, j := range jobs {
			if got := e.waitEnded(j.ID); got.State != wire.JobSucceeded || got.AttemptCount != 1 {
				t.Fatalf("turn %s: %s", j.ID, describeJob(got))
			}
		}
		m := scrape(t, e.cp.URL+"/metrics")
		var attemptScoped float64 // the renewals', reports' and the turn child's requests, batches counted once
		for series, v := range m {
			if strings.HasPrefix(series, "controlplane_http_request_duration_seconds_count{") &&
				(strings.Contains(series, wire.AttemptPath("{job}", "")) || strings.Contains(series, wire.PathWorkerBatch)) {
				attemptScoped += v
			}
		}
		return m, attemptScoped / turns
	}
	var batched, plain map[string]float64
	var batchedPerTurn, plainPerTurn float64
	t.Run("batched", func(t *testing.T) {
		batched, batchedPerTurn = run(t, true)
		if batched["controlplane_worker_batches_total"] < 1 {
			t.Fatalf("no worker batch request reached the control plane: %v", batched)
		}
		if n := batched[`controlplane_worker_batch_items_total{op="finish",status="200"}`]; n != turns {
			t.Fatalf("%v finish items answered 200 in batches, want %d (every turn's report)", n, turns)
		}
		if n := batched[`controlplane_worker_batch_items_total{op="renew",status="200"}`]; n != 0 {
			t.Fatalf("%v renewals in batches, want none: a renewal goes at once", n)
		}
		if batched[`controlplane_renewals_total{status="200"}`] < turns {
			t.Fatalf("renewals: %v", batched)
		}
	})
	t.Run("per_call", func(t *testing.T) {
		plain, plainPerTurn = run(t, false)
		if plain["controlplane_worker_batches_total"] != 0 {
			t.Fatalf("--batch-requests=false sent %v batch requests", plain["controlplane_worker_batches_total"])
		}
	})
	if batched != nil && plain != nil {
		t.Logf("attempt-scoped requests per turn (%d turns at once on one host; claims and host heartbeats not counted): batched %.1f (%v of them batch requests carrying %v items), per call %.1f",
			turns, batchedPerTurn, batched["controlplane_worker_batches_total"], batched["controlplane_worker_batch_items_total"], plainPerTurn)
	}
}

// scrape reads a Prometheus text page: each series by its name and labels
// as the page spells them, and each metric's name summed over its series.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		at := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[at+1:], 64)
		if at < 0 || err != nil {
			continue
		}
		series := line[:at]
		out[series] = v
		if name, _, ok := strings.Cut(series, "{"); ok {
			out[name] += v
		}
	}
	return out
}
