package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Renewals of one host's 64 running attempts over HTTP, each store: per
// call (64 requests at once, one per attempt) against one worker batch of
// the 64. It reports renewals/s.
func BenchmarkRenewalsPerCallVsBatch(b *testing.B) {
	const attempts = 64
	for _, sc := range stores {
		b.Run(sc.name, func(b *testing.B) {
			st := sc.db(b).open(b)
			srv := controlplane.New(controlplane.Config{Store: st, Logger: slog.New(slog.DiscardHandler)})
			hs := httptest.NewServer(srv.Handler())
			b.Cleanup(hs.Close)
			tr := &http.Transport{MaxIdleConns: attempts, MaxIdleConnsPerHost: attempts}
			b.Cleanup(tr.CloseIdleConnections)
			wc := &wire.Client{BaseURL: hs.URL, HTTP: &http.Client{Transport: tr}}
			ctx := context.Background()
			now, err := st.Now(ctx)
			if err != nil {
				b.Fatal(err)
			}
			host := controlplane.NewToken(controlplane.HostTokenPrefix)
			if _, err := st.CreateHost(ctx, "host-bench", controlplane.HashToken(host), store.Audit{Actor: "bench"}, now); err != nil {
				b.Fatal(err)
			}
			for range attempts {
				c, err := st.CreateConversation(ctx, wire.CreateConversationRequest{AgentCommand: []string{"agent"}}, now)
				if err == nil {
					_, err = st.EnqueueTurn(ctx, c.ID, "p", now)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			claims, err := wc.Claims(ctx, host, wire.ClaimRequest{MaxClaims: attempts})
			if err != nil || len(claims) != attempts {
				b.Fatalf("claim %d: %d, %v", attempts, len(claims), err)
			}
			renew := func(c wire.Claim) wire.RenewRequest {
				return wire.RenewRequest{AttemptRef: wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}}
			}
			b.Run("per_call", func(b *testing.B) {
				for range b.N {
					var wg sync.WaitGroup
					for _, c := range claims {
						wg.Go(func() {
							if _, err := wc.Renew(ctx, c.WorkerToken, c.JobID, renew(c)); err != nil {
								b.Error(err)
							}
						})
					}
					wg.Wait()
				}
				b.ReportMetric(float64(b.N*attempts)/b.Elapsed().Seconds(), "renewals/s")
			})
			b.Run("batch", func(b *testing.B) {
				var batch wire.WorkerBatch
				for _, c := range claims {
					body, _ := json.Marshal(renew(c))
					batch.Items = append(batch.Items, wire.BatchItem{Op: wire.OpRenew, JobID: c.JobID, WorkerToken: c.WorkerToken, Body: body})
				}
				body, _ := json.Marshal(batch)
				for range b.N {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+wire.PathWorkerBatch, bytes.NewReader(body))
					req.Header.Set("Authorization", "Bearer "+host)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						b.Fatal(err)
					}
					var out wire.WorkerBatchResponse
					err = json.NewDecoder(resp.Body).Decode(&out)
					resp.Body.Close()
					if err != nil || len(out.Results) != attempts {
						b.Fatalf("batch answer: %d results, %v", len(out.Results), err)
					}
					for i, r := range out.Results {
						if r.Status != http.StatusOK {
							b.Fatal(fmt.Sprintf("item %d: %d %s", i, r.Status, r.Body))
						}
					}
				}
				b.ReportMetric(float64(b.N*attempts)/b.Elapsed().Seconds(), "renewals/s")
			})
		})
	}
}
