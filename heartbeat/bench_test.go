package heartbeat_test

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/memnet"
	"github.com/runnerd/runnerd/wire"
)

// BenchmarkRenewers runs many renewers at once against an in-process lease
// endpoint (a real http.Server over memnet, in real time) sharing one
// renewal client, as one daemon's attempts would. One op is one
// acknowledged renewal. Reported:
//
//	B/renewer        heap and stack held per idle renewer
//	cpu-ns/renewal   process CPU (user+system) per renewal, client and endpoint together
//
// Run short: go test -run '^$' -bench Renewers -benchtime 20000x ./heartbeat/
func BenchmarkRenewers(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("renewers=%d", n), func(b *testing.B) { benchRenewers(b, n) })
	}
}

func benchRenewers(b *testing.B, n int) {
	// About 5,000 renewals a second in all, whatever n.
	interval := time.Duration(n) * time.Second / 5000
	answer := []byte(`{"lease_expires_at":"2030-01-01T00:00:00Z","lease_ttl_ms":120000,"cancel_requested":false}`)
	var acks atomic.Int64
	target := int64(b.N)
	reached := make(chan struct{})
	l := memnet.Listen(host)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
		if acks.Add(1) == target {
			close(reached)
		}
	})}
	go srv.Serve(l)
	defer srv.Close()
	hc := heartbeat.NewHTTPClient(heartbeat.HTTPConfig{DialContext: l.Dial, MaxConnsPerHost: 64})
	defer hc.CloseIdleConnections()
	cfg := heartbeat.Config{
		Client:  &wire.Client{BaseURL: "http://" + host, HTTP: hc},
		Timings: heartbeat.Timings{Interval: interval},
	}

	before := memInUse()
	start := time.Now()
	rs := make([]*heartbeat.Renewer, n)
	for i := range rs {
		// Claims spread over half an interval, so the first renewals do
		// not all fall on one instant and none comes before we measure.
		rs[i] = heartbeat.Start(cfg, heartbeat.Attempt{
			JobID: fmt.Sprint("job-", i), AttemptID: fmt.Sprint("att-", i), LeaseGeneration: 1, WorkerToken: token,
			ClaimSent: start.Add(-rand.N(interval / 2)),
		})
	}
	perRenewer := float64(memInUse()-before) / float64(n)
	if acks.Load() != 0 {
		b.Logf("%d renewals before the memory was measured", acks.Load())
	}

	cpu0 := cpuTime()
	b.ResetTimer()
	<-reached
	b.StopTimer()
	cpu := cpuTime() - cpu0

	for _, r := range rs {
		r.Stop()
	}
	for _, r := range rs {
		if v := r.Verdict(); v.Outcome != heartbeat.Stopped {
			b.Fatalf("verdict %v", v.Outcome)
		}
	}
	b.ReportMetric(perRenewer, "B/renewer")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/renewal")
}

func memInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
