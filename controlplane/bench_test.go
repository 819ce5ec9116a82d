package controlplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Claim → finish over HTTP with 16 workers, each store, as
// 16/batch hosts of batch slots: a host claims up to batch turns in one
// request and finishes each on a worker of its own, then claims again.
// batch=1 is one turn per claim request, as before batched claims. Run
// with a fixed count, e.g. -benchtime 3000x; it reports turns/s.
func BenchmarkClaimFinishHTTP(b *testing.B) {
	const workers = 16
	for _, sc := range stores {
		for _, batch := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("%s/batch=%d", sc.name, batch), func(b *testing.B) {
				st := sc.db(b).open(b)
				srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler)})
				hs := httptest.NewServer(srv.Handler())
				b.Cleanup(hs.Close)
				tr := &http.Transport{MaxIdleConns: workers, MaxIdleConnsPerHost: workers}
				b.Cleanup(tr.CloseIdleConnections)
				wc := &wire.Client{BaseURL: hs.URL, HTTP: &http.Client{Transport: tr}}
				ctx := context.Background()
				now, err := st.Now(ctx)
				if err != nil {
					b.Fatal(err)
				}
				hosts := make([]string, workers/batch)
				for i := range hosts {
					hosts[i] = controlplane.NewToken(controlplane.HostTokenPrefix)
					if _, err := st.CreateHost(ctx, fmt.Sprintf("host-%d", i), controlplane.HashToken(hosts[i]), store.Audit{Actor: "test"}, now); err != nil {
						b.Fatal(err)
					}
				}
				for range b.N {
					c, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"agent"}}, now)
					if err == nil {
						_, err = st.EnqueueTurn(ctx, c.ID, "p", now)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				var done atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for _, tok := range hosts {
					wg.Go(func() {
						for done.Load() < int64(b.N) {
							cs, err := wc.Claims(ctx, tok, wire.ClaimRequest{MaxClaims: batch, LeaseTTLMS: 600_000})
							if err != nil {
								if err != wire.ErrNoClaim {
									b.Error(err)
								}
								return
							}
							var fin sync.WaitGroup
							for _, c := range cs {
								fin.Go(func() {
									ref := wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
									if _, err := wc.Finish(ctx, c.WorkerToken, c.JobID, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed, Class: "bench"}); err != nil {
										b.Error(err)
									}
									done.Add(1)
								})
							}
							fin.Wait()
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(done.Load())/b.Elapsed().Seconds(), "turns/s")
			})
		}
	}
}
