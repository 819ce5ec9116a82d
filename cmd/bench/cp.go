package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// size picks a benchmark's count: full, or the token size of -quick.
func (b *bench) size(full, quick int) int {
	if b.o.quick {
		return quick
	}
	return full
}

// benchLease is the lease every benchmark asks for: long enough that no
// lease expires while a benchmark holds it, so an expiry is a fault.
const benchLease = 10 * time.Minute

// B1: claim, renew and finish, each on its own, straight on the store
// from b.o.workers goroutines (as from many hosts at once). The renewal is
// RenewAs, the worker's call the HTTP handler makes (token, fence and
// lease in one statement), on the database's clock.
func (b *bench) b1(ctx context.Context, k storeKind) error {
	n := b.size(2000, 40)
	s, closeStore, err := b.openStore(ctx, k)
	if err != nil {
		return err
	}
	defer closeStore()
	hostID, _, err := newHost(ctx, s, "bench")
	if err != nil {
		return err
	}
	if _, err := queue(ctx, s, b.o.workers, n, []string{"agent"}); err != nil {
		return err
	}
	b.logf("B1 %s: %d turns queued", k, n)
	var leases []lease
	cpu := cpuClock()
	took, err := timed(func() (err error) {
		leases, err = claimAll(ctx, s, b.o.workers, n, hostID, benchLease)
		return err
	})
	if err != nil {
		return err
	}
	b.rep.add(row{ID: "B1", Store: k, What: "store claim", Value: rate(n, took), Unit: "claims/s",
		Detail: fmt.Sprintf("%d claims, %s CPU each", n, perOp(cpuClock()-cpu, n))})

	cpu = cpuClock()
	took, err = parallel(ctx, b.o.workers, n, func(ctx context.Context, i int) error {
		_, err := s.RenewAs(ctx, leases[i].worker(), leases[i].ref, benchLease, time.Time{})
		return err
	})
	if err != nil {
		return err
	}
	b.rep.add(row{ID: "B1", Store: k, What: "store renew", Value: rate(n, took), Unit: "renewals/s",
		Detail: fmt.Sprintf("%d renewals, %s CPU each", n, perOp(cpuClock()-cpu, n))})

	cpu = cpuClock()
	took, err = parallel(ctx, b.o.workers, n, func(ctx context.Context, i int) error {
		now, err := s.Now(ctx)
		if err != nil {
			return err
		}
		_, err = s.Finish(ctx, leases[i].ref, wire.FinishRequest{AttemptRef: leases[i].ref, Outcome: wire.OutcomeFailed, Class: "bench"}, now)
		return err
	})
	if err != nil {
		return err
	}
	b.rep.add(row{ID: "B1", Store: k, What: "store finish", Value: rate(n, took), Unit: "finishes/s",
		Detail: fmt.Sprintf("%d finishes, %s CPU each", n, perOp(cpuClock()-cpu, n))})
	return nil
}

// server is the reference control plane on a store, served over loopback
// TCP in this process.
type server struct {
	URL    string
	srv    *http.Server
	client *wire.Client
}

func serve(s store.Store, conns int) (*server, error) {
	cp := controlplane.New(controlplane.Config{Store: s, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: cp.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	url := "http://" + l.Addr().String()
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute}
	return &server{URL: url, srv: srv, client: &wire.Client{BaseURL: url, HTTP: &http.Client{Transport: tr, Timeout: time.Minute}}}, nil
}

func (sv *server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = sv.srv.Shutdown(ctx)
	sv.client.HTTP.CloseIdleConnections()
}

// roundTrips counts PostgreSQL's round trips per worker call over HTTP:
// turns one at a time, each claimed, renewed and finished, each call
// counted on its own (sqltest.CountRoundTrips) once the pool is warm.
func (b *bench) roundTrips(ctx context.Context, s store.Store, sv *server, hostToken string, trips *atomic.Int64) error {
	const warm = 4
	m := b.size(50, 5)
	if _, err := queue(ctx, s, 1, warm+m, []string{"agent"}); err != nil {
		return err
	}
	var claims, renews, finishes int64
	count := func(sum *int64, f func() error) error {
		before := trips.Load()
		err := f()
		*sum += trips.Load() - before
		return err
	}
	for i := range warm + m {
		if i == warm {
			claims, renews, finishes = 0, 0, 0
		}
		var c wire.Claim
		if err := count(&claims, func() (err error) {
			c, err = sv.client.Claim(ctx, hostToken, wire.ClaimRequest{WaitMS: 0, LeaseTTLMS: benchLease.Milliseconds()})
			return err
		}); err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
		if err := count(&renews, func() error {
			_, err := sv.client.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref, LeaseTTLMS: benchLease.Milliseconds()})
			return err
		}); err != nil {
			return fmt.Errorf("renew: %w", err)
		}
		if err := count(&finishes, func() error {
			_, err := sv.client.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed, Class: "bench"})
			return err
		}); err != nil {
			return fmt.Errorf("finish: %w", err)
		}
	}
	per := func(n int64) float64 { return float64(n) / float64(m) }
	detail := fmt.Sprintf("%d turns one at a time, after %d to warm the pool; each request the server waited on counts", m, warm)
	b.rep.add(row{ID: "B2", Store: postgres, What: "round trips to PostgreSQL per claim", Value: per(claims), Unit: "round trips", Detail: detail})
	b.rep.add(row{ID: "B2", Store: postgres, What: "round trips to PostgreSQL per renew", Value: per(renews), Unit: "round trips", Detail: detail})
	b.rep.add(row{ID: "B2", Store: postgres, What: "round trips to PostgreSQL per finish", Value: per(finishes), Unit: "round trips", Detail: detail})
	return nil
}

// B6: a renewal storm. n leases run at once; every one of them is renewed
// once, as fast as b.o.workers×4 callers can, first straight on the store
// (RenewAs, the handler's call) and then over HTTP. No renewal may be refused: a refusal would be a
// lease lost to the storm.
func (b *bench) b6(ctx context.Context, k storeKind) error {
	n := b.o.storm
	s, closeStore, err := b.openStore(ctx, k)
	if err != nil {
		return err
	}
	defer closeStore()
	hostID, _, err := newHost(ctx, s, "bench")
	if err != nil {
		return err
	}
	callers := 4 * b.o.workers
	setup := time.Now()
	leases := make([]lease, n)
	hashes := make([][]byte, n)
	for i := range leases {
		leases[i].token = controlplane.WorkerTokenPrefix + rand.Text()
		hashes[i] = controlplane.HashToken(leases[i].token)
	}
	now, err := s.Now(ctx)
	if err != nil {
		return err
	}
	jobs, err := s.SeedLeases(ctx, hostID, "bench", "storm", hashes, benchLease, now)
	if err != nil {
		return err
	}
	for i, job := range jobs {
		leases[i].jobID = job
		leases[i].ref = wire.AttemptRef{AttemptID: fmt.Sprintf("storma%d", i+1), LeaseGeneration: 1}
	}
	b.logf("B6 %s: %d leases running (set up in %s)", k, n, time.Since(setup).Round(time.Millisecond))

	took, err := parallel(ctx, callers, n, func(ctx context.Context, i int) error {
		_, err := s.RenewAs(ctx, leases[i].worker(), leases[i].ref, benchLease, time.Time{})
		return err
	})
	if err != nil {
		return fmt.Errorf("store renewal: %w", err)
	}
	b.rep.add(row{ID: "B6", Store: k, What: fmt.Sprintf("renewal storm, %d leases, in the store", n), Value: took.Seconds(), Unit: "s",
		Detail: fmt.Sprintf("%s renewals/s, %d callers, none refused", number(rate(n, took)), callers)})

	sv, err := serve(s, callers)
	if err != nil {
		return err
	}
	defer sv.Close()
	cpu := cpuClock()
	took, err = parallel(ctx, callers, n, func(ctx context.Context, i int) error {
		l := leases[i]
		_, err := sv.client.Renew(ctx, l.token, l.jobID, wire.RenewRequest{AttemptRef: l.ref, LeaseTTLMS: benchLease.Milliseconds()})
		return err
	})
	if err != nil {
		return fmt.Errorf("HTTP renewal: %w", err)
	}
	b.rep.add(row{ID: "B6", Store: k, What: fmt.Sprintf("renewal storm, %d leases, over HTTP", n), Value: took.Seconds(), Unit: "s",
		Detail: fmt.Sprintf("%s renewals/s, %d callers, none refused; %s CPU per renewal", number(rate(n, took)), callers, perOp(cpuClock()-cpu, n))})
	return nil
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// cpuClock is this process's CPU time so far, user and system.
func cpuClock() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func perOp(d time.Duration, n int) string {
	per := d / time.Duration(n)
	switch {
	case per >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(per)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%d µs", per.Microseconds())
	}
}
