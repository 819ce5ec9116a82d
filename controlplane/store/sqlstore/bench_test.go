package sqlstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// Store benchmarks, each on SQLite (synchronous NORMAL and FULL) and
// PostgreSQL (when RUNNERD_TEST_POSTGRES is set). Keep them short on a
// shared machine, e.g. -benchtime=2000x. Each reports its own rate.

type benchStore struct {
	name string
	open func(testing.TB) *Store
}

var benchStores = []benchStore{
	{"sqlite-normal", func(tb testing.TB) *Store { return OpenTestSQLite(tb, WithSynchronous(SyncNormal)) }},
	{"sqlite-full", func(tb testing.TB) *Store { return OpenTestSQLite(tb, WithSynchronous(SyncFull)) }},
	{"postgres", func(tb testing.TB) *Store { return OpenTestPostgres(tb) }},
}

func rate(b *testing.B, n int, unit string) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), unit)
}

// Claim with a deep queue: every claim takes the oldest runnable job,
// passing over turns that must wait for their conversation.
func BenchmarkClaim(b *testing.B) {
	for _, bs := range benchStores {
		for _, queued := range []int{10_000, 100_000} {
			b.Run(fmt.Sprintf("%s/queued=%d", bs.name, queued), func(b *testing.B) {
				s := bs.open(b)
				// The queue holds at least `queued` jobs through the whole
				// run, and as many again that wait behind a running turn of
				// their conversation, ahead of them in the queue.
				fillBlocked(b, s, "blocked", queued)
				fill(b, s, "q", queued+b.N, false, time.Time{})
				ctx := context.Background()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					_, ok, err := s.Claim(ctx, store.ClaimParams{HostID: "host_bench", LeaseTTL: 2 * time.Minute,
						WorkerTokenHash: []byte(fmt.Sprintf("w%d", i)), Now: t0})
					if err != nil || !ok {
						b.Fatalf("Claim = %v, %v", ok, err)
					}
				}
				rate(b, b.N, "claims/s")
			})
		}
	}
}

// Claim with as many turns pinned to another host's sandboxes queued
// ahead of this host's: host affinity must not make the claim read them.
func BenchmarkClaimOtherHostsAhead(b *testing.B) {
	const queued = 10_000
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			s := bs.open(b)
			fill(b, s, "other", queued, false, time.Time{})
			pin(b, s, "other", "host_other")
			fill(b, s, "q", queued+b.N, false, time.Time{})
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c, ok, err := s.Claim(ctx, store.ClaimParams{HostID: "host_bench", LeaseTTL: 2 * time.Minute,
					WorkerTokenHash: []byte(fmt.Sprintf("w%d", i)), Now: t0})
				if err != nil || !ok || c.Turn.ConversationID[0] != 'q' {
					b.Fatalf("Claim = %s, %v, %v", c.Turn.ConversationID, ok, err)
				}
			}
			rate(b, b.N, "claims/s")
		})
	}
}

// One fenced renewal per transaction, round robin over 1,000 live leases.
func BenchmarkRenew(b *testing.B) {
	const leases = 1000
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			s := bs.open(b)
			fill(b, s, "r", leases, true, t0.Add(time.Hour))
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ref := wire.AttemptRef{AttemptID: fmt.Sprintf("ra%d", i%leases+1), LeaseGeneration: 1}
				if _, err := s.Renew(ctx, ref, 2*time.Minute, t0.Add(time.Duration(i)*time.Microsecond)); err != nil {
					b.Fatal(err)
				}
			}
			rate(b, b.N, "renewals/s")
		})
	}
}

// Finish of a live, never-admitted attempt: the guarded update, the job's
// end, its conversation's next turn, the event and the stored answer.
func BenchmarkFinish(b *testing.B) {
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			s := bs.open(b)
			fill(b, s, "f", b.N, true, t0.Add(time.Hour))
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ref := wire.AttemptRef{AttemptID: fmt.Sprintf("fa%d", i+1), LeaseGeneration: 1}
				if _, err := s.Finish(ctx, ref, wire.FinishRequest{AttemptRef: ref, Outcome: wire.OutcomeFailed, Class: "bench"}, t0); err != nil {
					b.Fatal(err)
				}
			}
			rate(b, b.N, "finishes/s")
		})
	}
}

// A reaper sweep over 10,000 expired, never-admitted leases: each is
// superseded and its job requeued.
func BenchmarkReapSweep(b *testing.B) {
	const expired = 10_000
	for _, bs := range benchStores {
		b.Run(bs.name, func(b *testing.B) {
			s := bs.open(b)
			ctx := context.Background()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				fill(b, s, fmt.Sprintf("x%d_", i), expired, true, t0)
				b.StartTimer()
				res, err := s.Reap(ctx, store.ReapParams{Now: t0.Add(time.Minute), Grace: 10 * time.Second})
				if err != nil || res.Superseded != expired || res.Requeued != expired {
					b.Fatalf("Reap = %+v, %v", res, err)
				}
				b.StopTimer()
				// Take the requeued jobs off the queue for the next round.
				if err := s.write(ctx, func(tx txn) error {
					_, err := s.exec(ctx, tx, `UPDATE jobs SET state = 'cancelled' WHERE state = 'queued'`)
					return err
				}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			rate(b, b.N*expired, "leases/s")
		})
	}
}

// Claims and renewals from 8 goroutines at once, as from many hosts: on
// PostgreSQL concurrent commits share their WAL flushes; SQLite serializes
// them on its one writer.
func BenchmarkParallel(b *testing.B) {
	for _, bs := range benchStores {
		b.Run(bs.name+"/claim", func(b *testing.B) {
			s := bs.open(b)
			fill(b, s, "q", 10_000+b.N, false, time.Time{})
			ctx := context.Background()
			var n atomic.Int64
			b.SetParallelism(4) // 8 goroutines on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					_, ok, err := s.Claim(ctx, store.ClaimParams{HostID: "host_bench", LeaseTTL: 2 * time.Minute,
						WorkerTokenHash: []byte(fmt.Sprintf("w%d", n.Add(1))), Now: t0})
					if err != nil || !ok {
						b.Errorf("Claim = %v, %v", ok, err)
						return
					}
				}
			})
			rate(b, b.N, "claims/s")
		})
		b.Run(bs.name+"/renew", func(b *testing.B) {
			const leases = 1000
			s := bs.open(b)
			fill(b, s, "r", leases, true, t0.Add(time.Hour))
			ctx := context.Background()
			var n atomic.Int64
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					ref := wire.AttemptRef{AttemptID: fmt.Sprintf("ra%d", i%leases+1), LeaseGeneration: 1}
					if _, err := s.Renew(ctx, ref, 2*time.Minute, t0.Add(time.Duration(i)*time.Microsecond)); err != nil {
						b.Errorf("Renew: %v", err)
						return
					}
				}
			})
			rate(b, b.N, "renewals/s")
		})
	}
}
